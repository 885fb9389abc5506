"""codegen on the bytecode assembler: side effects evaluated in order between the graph call
and the return, the fence restored when the graph raises, sources whose keys and attribute
names are not Python literals or identifiers, and a large number of graph inputs (arguments
past 255 need EXTENDED_ARG)."""

import types

import pytest
import torch
import torch.fx

from ferrodyn import _C, codegen
from ferrodyn.source import AttrSource, GlobalSource, ItemSource, LocalSource
from ferrodyn.trace_result import OutCall, OutConst, OutGraph, OutSource, OutTuple, TraceResult


def _graph(n_inputs, body):
    g = torch.fx.Graph()
    phs = [g.placeholder(f"a{i}") for i in range(n_inputs)]
    g.output(tuple(body(g, *phs)))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def user(x, log):
    return x


def _builtins():
    return __builtins__ if isinstance(__builtins__, dict) else __builtins__.__dict__


def test_side_effects_run_in_order_after_the_graph_and_before_the_return():
    order = []

    def graph_fn(x):
        order.append("graph")
        return (x + 1,)

    def note(tag, value):
        order.append(tag)
        return value

    r = TraceResult(_graph(1, lambda g, a: [a]), [LocalSource(0, "x")], [], OutGraph(0),
                    side_effects=(OutCall(note, (OutConst("first"), OutGraph(0))),
                                  OutCall(list.append, (OutSource(LocalSource(1, "log")), OutGraph(0)))))
    fn = codegen.generate_entry(user.__code__, r, graph_fn, globals(), _builtins())
    log = []
    x = torch.zeros(2)
    got = fn(x, log)
    assert order == ["graph", "first"]
    assert len(log) == 1 and log[0] is got and torch.equal(got, x + 1)


def test_fence_is_restored_when_the_graph_raises():
    def graph_fn(x):
        assert _C.get_eval_frame() is False
        raise KeyError("inside the graph")

    r = TraceResult(_graph(1, lambda g, a: [a]), [LocalSource(0, "x")], [], OutGraph(0))
    fn = codegen.generate_entry(user.__code__, r, graph_fn, globals(), _builtins())
    cb = lambda frame: None  # noqa: E731
    prior = _C.set_eval_frame(cb)
    try:
        with pytest.raises(KeyError, match="inside the graph"):
            fn(torch.zeros(1), None)
        after = _C.get_eval_frame()
    finally:
        _C.set_eval_frame(prior)
    assert after is cb


WEIRD = {("a", 1): torch.ones(2), frozenset({3}): torch.full((2,), 2.0)}


def test_sources_with_non_literal_keys_and_non_identifier_attributes():
    ns = types.SimpleNamespace()
    setattr(ns, "not an identifier", torch.full((2,), 5.0))
    srcs = [ItemSource(GlobalSource("WEIRD"), ("a", 1)), ItemSource(GlobalSource("WEIRD"), frozenset({3})),
            AttrSource(LocalSource(1, "log"), "not an identifier")]
    r = TraceResult(_graph(3, lambda g, a, b, c: [g.call_function(torch.add, (g.call_function(torch.add, (a, b)), c))]),
                    srcs, [], OutGraph(0))
    fn = codegen.generate_entry(user.__code__, r, r.graph.forward, globals(), _builtins())
    assert torch.equal(fn(None, ns), torch.full((2,), 8.0))


def test_hundreds_of_graph_inputs_and_outputs():
    n = 300

    def body(g, *phs):
        return [g.call_function(torch.neg, (p,)) for p in phs]

    src = [ItemSource(LocalSource(0, "x"), i) for i in range(n)]
    r = TraceResult(_graph(n, body), src, [], OutTuple(tuple(OutGraph(i) for i in range(n))))
    fn = codegen.generate_entry(user.__code__, r, r.graph.forward, globals(), _builtins())
    xs = [torch.tensor([float(i)]) for i in range(n)]
    got = fn(xs, None)
    assert len(got) == n and all(torch.equal(g, -x) for g, x in zip(got, xs))


def test_exported_sources_are_loaded_from_the_extra_parameters():
    src = AttrSource(LocalSource(1, "log"), "weight")
    r = TraceResult(_graph(2, lambda g, a, b: [g.call_function(torch.add, (a, b))]),
                    [LocalSource(0, "x"), src], [], OutGraph(0))
    fn = codegen.generate_entry(user.__code__, r, r.graph.forward, globals(), _builtins(),
                                exported=[src])
    # the exported value wins over reading log.weight again
    ns = types.SimpleNamespace(weight=torch.full((2,), 100.0))
    got = fn(torch.ones(2), ns, torch.full((2,), 2.0))
    assert torch.equal(got, torch.full((2,), 3.0))


def test_shared_values_are_evaluated_once_and_are_the_same_object(monkeypatch):
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Shared:  # the shape of trace_result.OutShared (side-effects work)
        key: int
        value: object

    monkeypatch.setitem(codegen.OUT_RENDERERS, Shared, codegen._out_shared)
    calls = []

    def make():
        calls.append(1)
        return []

    s = Shared(0, OutCall(make, ()))
    r = TraceResult(_graph(0, lambda g: []), [], [], OutTuple((s, s, OutConst(1))))
    got = codegen.generate_entry(user.__code__, r, None, globals(), _builtins())(None, None)
    assert got[0] is got[1] and got[2] == 1 and calls == [1]

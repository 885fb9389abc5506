"""codegen.generate_entry: entry functions built from hand-made TraceResults, called the way the
Rust hook calls them (argument slots, then closure cells), compared with the original."""

import collections
import dataclasses
import traceback

import pytest
import torch
import torch.fx

from ferrodyn import codegen
from ferrodyn.source import AttrSource, ClosureSource, GlobalSource, ItemSource, LocalSource
from ferrodyn.trace_result import (OutCall, OutConst, OutDict, OutGraph, OutList, OutSource,
                                   OutTuple, TraceResult)


def graph_of(fn, n_inputs):
    """An fx graph of `fn(*inputs)` returning a flat tuple (what the translator hands over)."""
    g = torch.fx.Graph()
    phs = [g.placeholder(f"a{i}") for i in range(n_inputs)]
    out = fn(*phs, g)
    g.output(tuple(out))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def add_mul(a, b, g):
    s = g.call_function(torch.add, (a, b))
    return [s, g.call_function(torch.mul, (s, b))]


def entry_for(code, result, f_globals=None):
    f_globals = globals() if f_globals is None else f_globals
    return codegen.generate_entry(code, result, result.graph.forward, f_globals, __builtins__ if isinstance(__builtins__, dict) else __builtins__.__dict__)


def user_fn(x, y):
    s = x + y
    return s, s * y


def test_entry_matches_original_on_two_tensor_args():
    r = TraceResult(graph_of(add_mul, 2), [LocalSource(0, "x"), LocalSource(1, "y")], [],
                    OutTuple((OutGraph(0), OutGraph(1))))
    fn = entry_for(user_fn.__code__, r)
    x, y = torch.randn(3), torch.randn(3)
    got, want = fn(x, y), user_fn(x, y)
    assert type(got) is tuple and len(got) == 2
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_entry_is_named_and_placed_like_the_original():
    r = TraceResult(graph_of(add_mul, 2), [LocalSource(0, "x"), LocalSource(1, "y")], [],
                    OutGraph(0))
    fn = entry_for(user_fn.__code__, r)
    assert fn.__name__ == "user_fn" and fn.__qualname__ == user_fn.__qualname__
    assert fn.__code__.co_filename == user_fn.__code__.co_filename
    assert fn.__code__.co_firstlineno == user_fn.__code__.co_firstlineno


def test_traceback_from_the_graph_points_into_the_users_function():
    def boom(a, g):
        return [g.call_function(torch.matmul, (a, a))]

    r = TraceResult(graph_of(boom, 1), [LocalSource(0, "x")], [], OutGraph(0))
    fn = entry_for(user_fn.__code__, r)
    with pytest.raises(RuntimeError) as info:
        fn(torch.randn(2, 3), torch.randn(1))  # matmul of 2x3 @ 2x3 fails
    frames = traceback.extract_tb(info.value.__traceback__)
    mine = [f for f in frames if f.name == "user_fn"]
    assert mine, [f.name for f in frames]
    first, last = user_fn.__code__.co_firstlineno, user_fn.__code__.co_firstlineno + 3
    assert mine[0].filename == __file__ and first <= mine[0].lineno <= last


Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Pair:
    left: object
    right: object


def test_rebuilds_nested_containers_constants_and_classes():
    key = object()
    out = OutDict(
        keys=("t", "const", "lst", "nt", "dc", 7),
        values=(
            OutTuple((OutGraph(0),)),
            OutConst(2.5),
            OutList((OutGraph(1), OutConst(None), OutConst("s"))),
            OutCall(Point, (OutGraph(0), OutConst(3))),
            OutCall(Pair, (OutConst(key), OutGraph(1)), kwnames=("left", "right")),
            OutConst(True),
        ),
    )
    r = TraceResult(graph_of(add_mul, 2), [LocalSource(0, "x"), LocalSource(1, "y")], [], out)
    fn = entry_for(user_fn.__code__, r)
    x, y = torch.randn(3), torch.randn(3)
    s, m = user_fn(x, y)
    got = fn(x, y)
    assert list(got) == ["t", "const", "lst", "nt", "dc", 7]
    assert type(got["t"]) is tuple and torch.equal(got["t"][0], s)
    assert got["const"] == 2.5
    assert torch.equal(got["lst"][0], m) and got["lst"][1:] == [None, "s"]
    assert type(got["nt"]) is Point and torch.equal(got["nt"].x, s) and got["nt"].y == 3
    assert type(got["dc"]) is Pair and got["dc"].left is key and torch.equal(got["dc"].right, m)
    assert got[7] is True


def test_ordered_dict_output_keeps_its_class():
    out = OutDict(keys=("b", "a"), values=(OutGraph(0), OutConst(1)), cls=collections.OrderedDict)
    r = TraceResult(graph_of(add_mul, 2), [LocalSource(0, "x"), LocalSource(1, "y")], [], out)
    got = entry_for(user_fn.__code__, r)(torch.ones(1), torch.ones(1))
    assert type(got) is collections.OrderedDict and list(got) == ["b", "a"]


SCALE = torch.tensor([2.0])


def test_inputs_from_globals_attributes_items_and_closure_cells():
    factor = torch.tensor([3.0])

    def f(mod, xs):
        return mod.weight * xs[1] * SCALE * factor

    def body(w, x1, sc, fa, g):
        t = g.call_function(torch.mul, (w, x1))
        t = g.call_function(torch.mul, (t, sc))
        return [g.call_function(torch.mul, (t, fa))]

    srcs = [AttrSource(LocalSource(0, "mod"), "weight"), ItemSource(LocalSource(1, "xs"), 1),
            GlobalSource("SCALE"), ClosureSource(0, "factor")]
    r = TraceResult(graph_of(body, 4), srcs, [], OutGraph(0))
    fn = entry_for(f.__code__, r)
    mod = torch.nn.Linear(2, 2)
    xs = [torch.randn(2), torch.randn(2)]
    got = fn(mod, xs, *f.__closure__)  # the hook passes the closure cells after the slots
    assert torch.equal(got, f(mod, xs))


def test_output_read_from_the_frame_is_the_same_object():
    def f(x, cfg):
        return x, cfg

    cfg = {"a": 1}
    r = TraceResult(graph_of(lambda a, g: [g.call_function(torch.neg, (a,))], 1),
                    [LocalSource(0, "x")], [], OutTuple((OutGraph(0), OutSource(LocalSource(1, "cfg")))))
    x = torch.randn(2)
    got = entry_for(f.__code__, r)(x, cfg)
    assert torch.equal(got[0], -x) and got[1] is cfg


def test_no_graph_entry_returns_constants():
    def f(n):
        return n + 1

    r = TraceResult(graph_of(lambda g: [], 0), [], [], OutConst(4))
    fn = codegen.generate_entry(f.__code__, r, None, globals(), {})
    assert fn(3) == 4 and "graph" not in fn.__ferrodyn_source__.split("return")[0]


@pytest.mark.parametrize("src, n", [
    ("def f(a, b=1, *args, c, d=2, **kw): pass", 6),
    ("def f(*args): pass", 1),
    ("def f(**kw): pass", 1),
    ("def f(a, /, b): pass", 2),
    ("def f(): x = 1", 0),
])
def test_argument_slot_count(src, n):
    ns = {}
    exec(src, ns)
    assert codegen.argument_slot_count(ns["f"].__code__) == n


def test_varargs_and_kwargs_slots_reach_the_graph():
    def f(x, *args, scale=2, **kw):
        return x * args[0] + kw["z"]

    def body(x, a0, z, g):
        return [g.call_function(torch.add, (g.call_function(torch.mul, (x, a0)), z))]

    srcs = [LocalSource(0, "x"), ItemSource(LocalSource(2, "args"), 0), ItemSource(LocalSource(3, "kw"), "z")]
    r = TraceResult(graph_of(body, 3), srcs, [], OutGraph(0))
    fn = entry_for(f.__code__, r)
    x, a, z = torch.randn(2), torch.randn(2), torch.randn(2)
    # slots in co_varnames order: x, scale, args, kw
    assert torch.equal(fn(x, 2, (a,), {"z": z}), f(x, a, z=z))


def test_odd_parameter_names_are_renamed():
    ns = {}
    exec("def f(__ferrodyn_out, y):\n    return y", ns)
    r = TraceResult(graph_of(lambda a, g: [g.call_function(torch.neg, (a,))], 1),
                    [LocalSource(1, "y")], [], OutTuple((OutGraph(0), OutSource(LocalSource(0, "__ferrodyn_out")))))
    fn = entry_for(ns["f"].__code__, r, ns)
    y = torch.randn(2)
    got = fn("first", y)
    assert got[1] == "first" and torch.equal(got[0], -y)


def test_graph_runs_fenced_unless_told_otherwise():
    from ferrodyn import _C

    seen = []

    def graph_fn(a):
        seen.append(_C.get_eval_frame())
        return (a,)

    r = TraceResult(graph_of(lambda a, g: [a], 1), [LocalSource(0, "x")], [], OutGraph(0))
    cb = lambda frame: None  # noqa: E731
    prior = _C.set_eval_frame(cb)
    try:
        codegen.generate_entry(user_fn.__code__, r, graph_fn, globals(), {})(1, 2)
        codegen.generate_entry(user_fn.__code__, r, graph_fn, globals(), {}, fence=False)(1, 2)
        after = _C.get_eval_frame()
    finally:
        _C.set_eval_frame(prior)
    assert seen == [False, cb] and after is cb

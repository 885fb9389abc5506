"""Test harness for the symbolic converter: drive `trace_frame` directly on a Python function,
run the captured graph with inputs loaded from their Sources, rebuild the return value from
`TraceResult.output`, and compare with eager. (Not a test module itself.)"""

from __future__ import annotations

import builtins
import copy
import inspect
from typing import Any

import torch

from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import (AttrSource, BuiltinSource, ClosureSource, DictOfSource,
                             GlobalSource, ItemSource, LenSource, LocalSource, TypeSource)
from ferrodyn.symbolic import trace_frame
from ferrodyn.trace_result import (OutCall, OutConst, OutDict, OutGraph, OutList, OutShared,
                                   OutSource, OutTuple)


def frame_slots(fn, args, kwargs) -> tuple:
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    slots = []
    for p in sig.parameters.values():
        v = bound.arguments.get(p.name)
        if p.kind is p.VAR_POSITIONAL:
            v = tuple(v or ())
        elif p.kind is p.VAR_KEYWORD:
            v = dict(v or {})
        slots.append(v)
    code = fn.__code__
    names = code.co_varnames
    order = {p: i for i, p in enumerate(sig.parameters)}
    return tuple(slots[order[names[i]]] for i in range(len(slots)))


def trace(fn, *args, **kwargs):
    return trace_frame(fn.__code__, fn.__globals__, builtins.__dict__,
                       frame_slots(fn, args, kwargs), fn.__closure__)


def load(source, fn, slots) -> Any:
    if isinstance(source, LocalSource):
        return slots[source.index]
    if isinstance(source, GlobalSource):
        return fn.__globals__[source.global_name]
    if isinstance(source, BuiltinSource):
        return builtins.__dict__[source.builtin_name]
    if isinstance(source, ClosureSource):
        return fn.__closure__[source.index].cell_contents
    base = load(source.base, fn, slots)
    if isinstance(source, AttrSource):
        return getattr(base, source.attr)
    if isinstance(source, ItemSource):
        return base[source.key]
    if isinstance(source, DictOfSource):
        return base.__dict__
    if isinstance(source, TypeSource):
        return type(base)
    if isinstance(source, LenSource):
        return len(base)
    raise TypeError(source)


def rebuild(out, graph_outs, fn, slots) -> Any:
    shared: dict = {}

    def r(o):
        if isinstance(o, OutShared):  # one object per key per call
            if o.key not in shared:
                shared[o.key] = r(o.value)
            return shared[o.key]
        if isinstance(o, OutGraph):
            return graph_outs[o.index]
        if isinstance(o, OutConst):
            return o.value
        if isinstance(o, OutSource):
            return load(o.source, fn, slots)
        if isinstance(o, OutTuple):
            return tuple(r(i) for i in o.items)
        if isinstance(o, OutList):
            return [r(i) for i in o.items]
        if isinstance(o, OutDict):
            return o.cls(zip(o.keys, [r(v) for v in o.values]))
        if isinstance(o, OutCall):
            args = [r(a) for a in o.args]
            if o.kwnames:
                return o.cls(**dict(zip(o.kwnames, args)))
            return o.cls(*args)
        raise TypeError(o)
    return r(out)


def run_traced(result, fn, *args, **kwargs):
    """Run a TraceResult as the frontend would: inputs loaded from their sources this call."""
    slots = frame_slots(fn, args, kwargs)
    inputs = [load(s, fn, slots) for s in result.graph_inputs]
    outs = result.graph(*inputs)
    assert isinstance(outs, tuple)
    return rebuild(result.output, outs, fn, slots)


def assert_same(a, b, *, rtol=1e-5, atol=1e-6):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), (type(a), type(b))
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        assert a.requires_grad == b.requires_grad, (a.requires_grad, b.requires_grad)
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
        return
    assert type(a) is type(b), (type(a), type(b), a, b)
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y, rtol=rtol, atol=atol)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k], rtol=rtol, atol=atol)
    elif hasattr(a, "__dataclass_fields__"):
        for f in a.__dataclass_fields__:
            assert_same(getattr(a, f), getattr(b, f), rtol=rtol, atol=atol)
    elif isinstance(a, torch.nn.Module):
        assert_same(a.state_dict(), b.state_dict(), rtol=rtol, atol=atol)
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        assert_same(vars(a), vars(b), rtol=rtol, atol=atol)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b, (a, b)


def check(fn, *args, seed: int | None = 0, **kwargs):
    """Trace `fn` on deep copies of the arguments, then compare graph vs eager on fresh copies
    (so in-place effects happen once per run and are compared too). Returns the TraceResult."""
    trace_args = copy.deepcopy((args, kwargs))
    result = trace(fn, *trace_args[0], **trace_args[1])
    eager_args = copy.deepcopy((args, kwargs))
    graph_args = copy.deepcopy((args, kwargs))
    if seed is not None:
        torch.manual_seed(seed)
    expected = fn(*eager_args[0], **eager_args[1])
    if seed is not None:
        torch.manual_seed(seed)
    got = run_traced(result, fn, *graph_args[0], **graph_args[1])
    assert_same(expected, got)
    assert_same(eager_args, graph_args)  # in-place effects on inputs match
    return result


def guard_kinds(result, source_name: str) -> set[GuardKind]:
    return {g.kind for g in result.guards if g.source is not None and
            g.source.name() == source_name}


def count_ops(result, target=None) -> int:
    nodes = [n for n in result.graph.graph.nodes if n.op in ("call_function", "call_method")]
    if target is None:
        return len(nodes)
    return sum(1 for n in nodes if n.target == target)

"""Test harness for the symbolic converter: drive `trace_frame` directly on a Python function,
run the captured graph through the real entry function (`codegen.generate_entry`: inputs
loaded from their Sources, the return value rebuilt from `TraceResult.output`), and compare
with eager. (Not a test module itself.)"""

from __future__ import annotations

import builtins
import copy
import inspect
from typing import Any

import torch

from ferrodyn import codegen
from ferrodyn.guard_spec import GuardKind
from ferrodyn.symbolic import trace_frame


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
    """The whole-frame capture of `fn` (fullgraph: an unsupported construct raises instead of
    becoming a graph break; graph breaks are tested through ferrodyn.compile)."""
    return trace_frame(fn.__code__, fn.__globals__, builtins.__dict__,
                       frame_slots(fn, args, kwargs), fn.__closure__, fullgraph=True)


def run_traced(result, fn, *args, **kwargs):
    """Run a TraceResult as the frontend would: through the real entry function
    (`codegen.generate_entry`), called the way the Rust hook calls it (argument slots, then
    closure cells), with the inputs loaded from their sources on this call."""
    slots = frame_slots(fn, args, kwargs)
    entry = codegen.generate_entry(fn.__code__, result, result.graph.forward, fn.__globals__,
                                   builtins.__dict__, fence=False)
    return entry(*slots, *(fn.__closure__ or ()))


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

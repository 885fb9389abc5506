"""A compiled graph that can reach user Python when it runs is fenced (the thread's callback is
off while it runs), so the user's functions behind a custom op are never traced as frames of
their own. Before the fix, a `torch.library.custom_op` counted as "closed" (it has no
`__code__`), its Python implementation was compiled at run time, and a transformers MoE model
(`torch.ops.transformers.grouped_mm_fallback`) gave 5-7 graphs where torch.compile gives 1."""

from __future__ import annotations

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from ferrodyn.convert_frame import graph_is_closed

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

_CALLS = []


@torch.library.custom_op("ferrodyn_test::segment_mm", mutates_args=())
def segment_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    _CALLS.append(1)
    out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype)
    start = 0
    for i, end in enumerate(offs.tolist()):  # data-dependent: a graph break if ever traced
        if end > start:
            out[start:end] = x[start:end] @ w[i]
        start = end
    return out


@segment_mm.register_fake
def _(x, w, offs):
    return x.new_empty(x.shape[0], w.shape[2])


def _user(x, w, offs):
    return torch.ops.ferrodyn_test.segment_mm(x, w, offs) * 2 + 1


def _inputs():
    return torch.randn(6, 4), torch.randn(2, 4, 3), torch.tensor([2, 6])


def test_custom_op_implementation_is_not_traced_at_run_time():
    args = _inputs()
    ref = _user(*args)
    torch._dynamo.reset()
    tb = CountingBackend()
    torch.testing.assert_close(torch.compile(_user, backend=tb)(*args), ref)
    fb = CountingBackend()
    compiled = ferrodyn.compile(_user, backend=fb)
    _CALLS.clear()
    for _ in range(3):
        torch.testing.assert_close(compiled(*args), ref)
    assert fb.count == tb.count == 1
    assert len(_CALLS) == 3  # the implementation ran each call, eagerly


def test_which_graphs_count_as_closed():
    def aten_only(x):
        return torch.relu(x) * 2

    aten_gm = torch.fx.symbolic_trace(aten_only)
    assert graph_is_closed(aten_gm)
    custom_gm = torch.fx.symbolic_trace(_user)
    assert not graph_is_closed(custom_gm)

    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.ops.ferrodyn_test.segment_mm.default, (x, x, x)))
    assert not graph_is_closed(torch.fx.GraphModule({}, g))  # an overload, not the packet

    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.ops.aten.sin.default, (x,)))
    assert graph_is_closed(torch.fx.GraphModule({}, g))

    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.ops.higher_order.cond, (x, x, x, (x,))))
    assert not graph_is_closed(torch.fx.GraphModule({}, g))

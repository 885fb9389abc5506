"""Unbacked symbols: `.item()` under `torch._dynamo.config.capture_scalar_outputs` is a graph
value (an unbacked SymFloat/SymInt, variables/sym_int.py `item_of`) used in tensor arithmetic;
a Python decision on it breaks the graph at the jump, as in torch.compile. Each program runs
compiled by ferrodyn and by torch.compile (CountingBackend on both), results equal to eager."""

from __future__ import annotations

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


@pytest.fixture(autouse=True)
def _torch_reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _inputs():
    out = []
    for n in (3, 5):
        for sign in (1, -1):
            out.append((torch.randn(n) + 3 * sign, torch.randn(n)))
    return out


def _run_both(fn, *, dynamic=None, inner="eager"):
    ours, theirs = CountingBackend(inner), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours, dynamic=dynamic)
    ct = torch.compile(fn, backend=theirs, dynamic=dynamic)
    for args in _inputs():
        expected = fn(*args)
        torch.testing.assert_close(cf(*args), expected)
        torch.testing.assert_close(ct(*args), expected)
    return ours, theirs


def float_item(x, y):
    s = x.sum().item()
    return y * s + s * 2


def int_item(x, y):
    n = x.argmax().item()
    return y + n


def branch_on_item(x, y):
    s = x.sum().item()
    if s > 0:
        return y + 1
    return y - 1


def item_into_factory(x, y):
    s = x.max().item()
    return torch.full((3,), s) + y.sum()


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("fn", [float_item, int_item, branch_on_item, item_into_factory],
                         ids=lambda f: f.__name__)
def test_captured_item_graph_count_matches_torch(fn, dynamic):
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        ours, theirs = _run_both(fn, dynamic=dynamic)
    assert ours.count == theirs.count


def test_captured_item_is_one_graph_with_an_unbacked_symbol():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        ours, _ = _run_both(float_item)
    gm = ours.graphs[0]
    (item,) = [n for n in gm.graph.nodes if n.target == "item"]
    assert item.meta["unbacked_bindings"]
    assert isinstance(item.meta["example_value"], torch.SymFloat)


def test_item_breaks_the_graph_without_the_flag():
    """(The float handed to the resumed frame is specialised: one graph per value, where
    torch.compile makes it a SymFloat after the first change, so counts are not compared.)"""
    ours, theirs = _run_both(float_item)
    assert ours.graphs and all(n.target != "item" for g in ours.graphs for n in g.graph.nodes)


def test_captured_item_through_aot_autograd():
    """The backend re-traces the graph in the capture's fake mode (unbacked symbols need its
    ShapeEnv), as under torch.compile."""
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        ours, theirs = _run_both(float_item, inner="aot_eager")
    assert ours.count == theirs.count

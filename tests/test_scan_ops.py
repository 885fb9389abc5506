"""`torch._higher_order_ops.associative_scan` (variables/scan_ops.py): combine_mode="pointwise"
is captured as torch's `associative_scan` higher-order op over the traced combine_fn;
combine_mode="generic" as the frontend's odd/even decomposition with the combine_fn's
elementwise ops replayed on the slices (torch.compile records the same decomposition around a
vmap). Results and gradients are eager's, graph counts torch.compile's; a combine_fn that is
not elementwise in generic mode breaks the graph at the call (values stay eager's)."""

import pytest
import torch
import torch._dynamo
from torch._higher_order_ops.associative_scan import associative_scan

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def linear_recurrence(left, right):  # transformers' mamba
    a_l, b_l = left
    a_r, b_r = right
    return a_l * a_r, a_r * b_l + b_r


def add(x, y):
    return x + y


def _run(fn, make, inner="eager"):
    """fn eagerly, with ferrodyn and with torch.compile on equal fresh arguments (twice):
    results and gradients of the arguments that require grad must be eager's."""
    ours, theirs = CountingBackend(inner), CountingBackend(inner)
    torch._dynamo.reset()
    res = {}
    for name, f in (("eager", fn), ("ferrodyn", ferrodyn.compile(fn, backend=ours)),
                    ("torch", torch.compile(fn, backend=theirs))):
        res[name] = []
        for _ in range(2):
            args = make()
            out = f(*args)
            leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            grads = torch.autograd.grad(out.sum(), leaves) if leaves else ()
            res[name].append((out, grads))
    torch._dynamo.reset()
    for (out, grads), (w_out, w_grads) in zip(res["ferrodyn"], res["eager"]):
        assert out.shape == w_out.shape and out.requires_grad == w_out.requires_grad
        torch.testing.assert_close(out, w_out)
        for g, w in zip(grads, w_grads):
            torch.testing.assert_close(g, w)
    return ours, theirs


def _seeded(*shapes):
    def make():
        torch.manual_seed(0)
        return tuple(torch.randn(*s) for s in shapes)
    return make


def _targets(backend) -> set:
    return {n.target for gm in backend.graphs for n in gm.graph.nodes if n.op == "call_function"}


def _pair(shape, grad=False):
    def make():
        torch.manual_seed(0)
        return (torch.rand(*shape, requires_grad=grad), torch.randn(*shape, requires_grad=grad))
    return make


@pytest.mark.parametrize("mode,reverse,length", [
    ("generic", False, 8), ("generic", True, 5), ("generic", False, 1),
    ("pointwise", False, 5), ("pointwise", True, 8)])
def test_mamba_recurrence(mode, reverse, length):
    def fn(a, b):
        _, states = associative_scan(linear_recurrence, (a, b), dim=2, reverse=reverse,
                                     combine_mode=mode)
        return states[:, :, -1] * 2 + states.mean()

    ours, theirs = _run(fn, _pair((2, 3, length, 4)))
    assert ours.count == theirs.count == 1
    hop = torch.ops.higher_order.associative_scan
    assert (hop in _targets(ours)) == (hop in _targets(theirs)) == (mode == "pointwise")


@pytest.mark.parametrize("mode", ["generic", "pointwise"])
def test_gradients_through_the_scan(mode):
    def fn(a, b):
        return associative_scan(linear_recurrence, (a.exp(), b), dim=0,
                                combine_mode=mode)[1] * 3

    ours, theirs = _run(fn, _pair((7, 3), grad=True))
    assert ours.count == theirs.count == 1


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_single_tensor_cumulative_sum_on_last_dim(inner):
    def fn(x):
        return associative_scan(add, x, dim=-1, combine_mode="generic") - x.cumsum(-1)

    ours, theirs = _run(fn, lambda: (torch.arange(30.0).reshape(3, 10),), inner=inner)
    assert ours.count == theirs.count == 1


def test_combine_fn_reading_a_tensor_from_outside():
    w = torch.tensor([0.5, 2.0, -1.0])

    def fn(x):
        return associative_scan(lambda l, r: l * w.abs() + r, x, dim=0, combine_mode="generic")

    ours, theirs = _run(fn, _seeded((6, 3)))
    assert ours.count == theirs.count == 1


def test_generic_combine_fn_that_is_not_elementwise_breaks():
    def reduce_rows(l, r):
        return l + r.sum(-1, keepdim=True)

    def fn(x):
        return associative_scan(reduce_rows, x * 1, dim=0, combine_mode="generic") + 1

    ours, theirs = _run(fn, _seeded((5, 3)))
    assert torch.ops.aten.slice not in _targets(ours)  # the scan ran eagerly
    assert theirs.count == 1 < ours.count


def test_generic_leaves_of_different_slice_shapes_break():
    def fn(a, b):
        return associative_scan(linear_recurrence, (a, b), dim=0, combine_mode="generic")[1]

    ours, theirs = _run(fn, _seeded((5, 3), (5, 4, 3)))
    assert torch.ops.aten.slice not in _targets(ours)


@pytest.mark.parametrize("mode", ["generic", "pointwise"])
def test_list_of_leaves_with_a_negative_dim(mode):
    def combine(left, right):
        return [torch.maximum(left[0], right[0]), left[1] + right[1] * 0.5]

    def fn(a, b):
        m, s = associative_scan(combine, [a, b], dim=-2, combine_mode=mode)
        return m - s

    ours, theirs = _run(fn, _seeded((3, 6, 2), (3, 6, 2)))
    assert ours.count == theirs.count == 1


LOG = []


def test_combine_fn_with_a_side_effect_breaks():
    def logging_add(x, y):
        LOG.append(1)
        return x + y

    def fn(x):
        return associative_scan(logging_add, x * 1, dim=0, combine_mode="generic") + 1

    LOG.clear()
    ours, theirs = _run(fn, _seeded((4, 2)))
    assert torch.ops.aten.slice not in _targets(ours)

"""Custom autograd Functions that write to an argument in place and mark it dirty
(`ctx.mark_dirty`), captured as one node that calls the real apply (variables/
autograd_function.py): apply returns the written argument itself, its autograd history rebased
onto the Function, so later uses of the argument, `is`, the written frame inputs and the
gradients are eager's; graph counts at most torch.compile's. Writes to an argument that is
not marked dirty, and what eager rejects (a view of a leaf), stay refused / eager's error."""

import pytest
import torch
import torch._dynamo

import ferrodyn
from counting_backend import CountingBackend
from test_autograd_function import _captured, _run

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class TimesThree(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(3)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 3


class AddInto(torch.autograd.Function):
    """Writes `b` into `a` (dirty), returns `a` and a fresh tensor."""

    @staticmethod
    def forward(ctx, a, b):
        a.add_(b)
        ctx.mark_dirty(a)
        ctx.save_for_backward(b)
        return a, b * 2

    @staticmethod
    def backward(ctx, ga, gb):
        (b,) = ctx.saved_tensors
        return ga, ga + gb * 2 + b * 0


class DirtyAndWritesAnother(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a.add_(1)
        b.add_(1)  # b is not marked dirty: refused
        ctx.mark_dirty(a)
        return a

    @staticmethod
    def backward(ctx, g):
        return g, None


def _xs(*shapes, grads=None):
    def make():
        torch.manual_seed(0)
        flags = grads or [True] * len(shapes)
        return tuple(torch.randn(*s, requires_grad=f) for s, f in zip(shapes, flags))
    return make


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_dirty_intermediate_is_the_result_and_later_uses_see_the_write(inner):
    def fn(x):
        y = x * 1
        z = TimesThree.apply(y)
        return z + y, z is y, y * 2

    ours, theirs = _run(fn, _xs((3,)), inner=inner)
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, TimesThree)


def test_discarded_result_still_rebases_the_argument():
    def fn(w):
        y = torch.ones(2, 2) @ w
        TimesThree.apply(y)
        return y.sum()

    ours, theirs = _run(fn, lambda: (torch.eye(2, requires_grad=True),))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, TimesThree)


def test_two_outputs_one_dirty():
    def fn(a, b):
        c = a.clone()
        out, twice = AddInto.apply(c, b)
        return out is c, out * twice, c

    ours, theirs = _run(fn, _xs((4,), (4,)))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, AddInto)


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_dirty_frame_inputs_are_written_as_in_eager(inner):
    def fn(x, y):
        return TimesThree.apply(x) + 1, AddInto.apply(y, x)[1]

    ours = CountingBackend(inner)
    compiled = ferrodyn.compile(fn, backend=ours)
    for _ in range(2):
        torch.manual_seed(0)
        x, y = torch.randn(3), torch.randn(3)
        xc, yc = x.clone(), y.clone()
        want = fn(x, y)
        got = compiled(xc, yc)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        assert torch.equal(xc, x) and torch.equal(yc, y)  # the frame's inputs, written
    assert ours.count == 1 and _captured(ours, TimesThree)


def test_dirty_non_leaf_frame_input_gradients_reach_its_leaf():
    def fn(x):
        return TimesThree.apply(x).sin()

    compiled = ferrodyn.compile(fn, backend=CountingBackend())
    grads = []
    for f in (fn, compiled):
        torch.manual_seed(0)
        leaf = torch.randn(3, requires_grad=True)
        out = f(leaf * 2)
        grads.append((out, torch.autograd.grad(out.sum(), leaf)[0]))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_dirty_view_of_a_leaf_raises_eagers_error():
    def fn(x):
        return TimesThree.apply(x.view_as(x))

    x = torch.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad") as want:
        fn(x)
    ours = CountingBackend()
    with pytest.raises(RuntimeError) as got:
        ferrodyn.compile(fn, backend=ours)(x)
    assert str(got.value) == str(want.value)
    assert not _captured(ours, TimesThree)


def test_write_to_an_argument_not_marked_dirty_breaks():
    def fn(x, y):
        a = x * 1
        return DirtyAndWritesAnother.apply(a, y) + 1

    def make():
        torch.manual_seed(0)
        return torch.randn(3, requires_grad=True), torch.zeros(3)

    ours, theirs = _run(fn, make)
    assert not _captured(ours, DirtyAndWritesAnother)
    x, y = make()
    ferrodyn.compile(fn, backend=CountingBackend())(x, y)
    assert torch.equal(y, torch.ones(3))

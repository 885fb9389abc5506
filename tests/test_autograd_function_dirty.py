"""Custom autograd Functions whose forward writes to an argument in place, marked dirty
(`ctx.mark_dirty`) or not, captured as one node that calls the real apply (variables/
autograd_function.py) at its place in the graph: later uses of the argument read the written
tensor, a dirty argument is apply's result itself (`is`, its history rebased onto the
Function), written frame inputs and gradients are eager's (also through aot backends); graph
counts at most torch.compile's. What eager rejects (a dirty view of a leaf) raises eager's
error."""

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
        b.add_(1)  # b is written but not marked dirty (and not returned)
        ctx.mark_dirty(a)
        return a

    @staticmethod
    def backward(ctx, g):
        return g, None


class WritesNoMark(torch.autograd.Function):
    """Writes its argument without mark_dirty and returns it: apply returns a new view."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


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


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_write_to_an_argument_not_marked_dirty(inner):
    def fn(x, y):
        a = x * 1
        out = DirtyAndWritesAnother.apply(a, y)
        return out + y, out is a, a

    def make():
        torch.manual_seed(0)
        return torch.randn(3, requires_grad=True), torch.zeros(3)

    ours, theirs = _run(fn, make, inner=inner)  # compares y, written, through the results
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, DirtyAndWritesAnother)
    x, y = make()
    ferrodyn.compile(fn, backend=CountingBackend(inner))(x, y)
    assert torch.equal(y, torch.ones(3))


@pytest.mark.parametrize("grad", [True, False])
def test_returned_written_argument_without_mark_dirty_is_a_new_tensor(grad):
    def fn(x):
        y = x * 1
        z = WritesNoMark.apply(y)
        return z + y, z is y, y

    ours, theirs = _run(fn, _xs((3,), grads=[grad]))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, WritesNoMark)


def test_written_frame_input_leaf_that_requires_grad():
    def fn(x):
        return WritesNoMark.apply(x) + x  # forward runs under no_grad: eager allows the write

    compiled = ferrodyn.compile(fn, backend=CountingBackend("aot_eager"))
    results = []
    for f in (fn, compiled):
        torch.manual_seed(0)
        x = torch.randn(3, requires_grad=True)
        out = f(x)
        results.append((out, x.detach().clone(), torch.autograd.grad(out.sum(), x)[0]))
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)


class MarkOnly(torch.autograd.Function):
    """Marks its argument dirty without writing it: apply still returns the argument itself."""

    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 5


def test_dirty_argument_not_written_is_still_the_result():
    def fn(x):
        y = x * 1
        z = MarkOnly.apply(y)
        return z is y, z * 2, y + 1

    ours, theirs = _run(fn, _xs((3,)))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, MarkOnly)

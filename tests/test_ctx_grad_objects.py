"""Grad-mode context objects (`torch.set_grad_enabled(m)`, `torch.no_grad()`,
`torch.enable_grad()`) that are values, not just `with` targets, compiled vs eager: made
before a graph break and entered after it (rebuilt by the entry without running the
constructor, guarded on the attributes their methods read when they come back in), passed
through an inlined function that breaks, returned, and made outside the frame. Values,
requires_grad, grad mode after the call and graph counts vs torch.compile's are compared."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

GB = torch._dynamo.graph_break


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.requires_grad == want.requires_grad
        torch.testing.assert_close(got.detach(), want.detach())
    elif type(want) in (torch.no_grad, torch.enable_grad, torch.set_grad_enabled):
        assert type(got) is type(want) and vars(got) == vars(want)
    else:
        assert got == want


def run_both(fn, *, outer=torch.enable_grad, rg=False, extra=()):
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    for _ in range(3):
        x = torch.zeros(4).requires_grad_(rg)
        with outer():
            want, grad_want = fn(x, *extra), torch.is_grad_enabled()
        with outer():
            got, grad_got = cf(x, *extra), torch.is_grad_enabled()
        _same(got, want)
        assert grad_got == grad_want
    torch._dynamo.reset()
    with outer():
        torch.compile(fn, backend=theirs)(torch.zeros(4).requires_grad_(rg), *extra)
    torch._dynamo.reset()
    return ours.count, theirs.count


@pytest.mark.parametrize("mode", [True, False])
@pytest.mark.parametrize("outer", [torch.enable_grad, torch.no_grad])
def test_set_grad_enabled_made_before_a_break_entered_after(mode, outer):
    def fn(x):
        x = x + 1
        ctx = torch.set_grad_enabled(mode)
        GB()
        with ctx:
            x = x * 2
        return x, torch.is_grad_enabled()

    ours, theirs = run_both(fn, outer=outer, rg=True)
    assert ours == theirs == 2


def _through(ctx):
    GB()
    return ctx


def test_context_passed_through_an_inlined_function_that_breaks():
    def fn(x):
        x = x + 1
        ctx = _through(torch.set_grad_enabled(False))
        with ctx:
            x = x + 1
        return x

    ours, theirs = run_both(fn, rg=True)
    assert ours == 2 and theirs >= 1


def _inner(x, ctx, y, z, dummy):
    with ctx:
        return x * y * z


def test_context_as_an_argument_of_a_call_with_a_breaking_argument():
    def fn(x):
        x = x + 1
        return _inner(x, torch.set_grad_enabled(True), 2, 3, GB())

    ours, theirs = run_both(fn, outer=torch.no_grad, rg=True)
    assert ours == theirs == 2


def test_returned_grad_mode_objects():
    def fn(x):
        b = torch.set_grad_enabled(False)
        torch.set_grad_enabled(True)
        return x + 1, b

    ours, theirs = run_both(fn)
    assert ours == 1 and theirs <= 1


def test_no_grad_object_from_outside_is_entered_eagerly():
    """Entering it sets its `prev` (eager writes the object): not modelled, so the frame
    gives up and the object ends as eager leaves it."""
    g = torch.no_grad()

    def fn(x, ctx):
        with ctx:
            y = x * 2
        return y

    cf = ferrodyn.compile(fn, backend=CountingBackend())
    with torch.enable_grad():
        got = cf(torch.ones(2, requires_grad=True), g)
    assert not got.requires_grad and g.prev is True and torch.is_grad_enabled()


def test_set_grad_enabled_object_from_outside_is_guarded_on_prev():
    def fn(x, ctx):
        with ctx:
            y = x * 2
        return y, torch.is_grad_enabled()

    backend = CountingBackend()
    cf = ferrodyn.compile(fn, backend=backend)
    for prev in (True, False, True):
        torch.set_grad_enabled(prev)
        ctx = torch.set_grad_enabled(False)   # prev: the mode it was made under
        got = cf(torch.ones(2, requires_grad=True), ctx)
        assert torch.is_grad_enabled() is prev
        assert got[1] is prev and not got[0].requires_grad  # as eager: exit restores prev
    torch.set_grad_enabled(True)
    assert backend.count == 2

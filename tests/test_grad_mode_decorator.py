"""Grad-mode contexts used as decorators inside the traced frame (`torch.no_grad()(f)`,
`torch.no_grad(f)`, `@torch.enable_grad()`, `torch.set_grad_enabled(m)(f)`): the wrapped call
runs in that mode, the mode around it is untouched (making the decorator changes nothing;
set_grad_enabled's constructor change is put back) and restored when the call raises.
Compiled vs eager (values, requires_grad, grad mode after), graph counts vs torch.compile."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _x():
    return torch.arange(4.0, requires_grad=True)


def _check(fn, outer_modes=(True, False)):
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    for outer in outer_modes:
        with torch.set_grad_enabled(outer):
            want = fn(_x())
            got = cf(_x())
            after = torch.is_grad_enabled()
        assert after == outer
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                assert g.requires_grad == w.requires_grad
                torch.testing.assert_close(g.detach(), w.detach())
            else:
                assert g == w
    assert torch.is_grad_enabled()
    torch._dynamo.reset()
    tc = torch.compile(fn, backend=theirs)
    for outer in outer_modes:
        with torch.set_grad_enabled(outer):
            tc(_x())
    torch._dynamo.reset()
    return ours.count, theirs.count


def call_forms(x):
    def inner(y):
        return y.sin(), torch.is_grad_enabled()

    a = torch.no_grad()(inner)
    b = torch.no_grad(inner)
    c = torch.enable_grad()(inner)
    mode_after_making = torch.is_grad_enabled()
    return (*a(x), *b(x), *c(x), mode_after_making, (x * 2).requires_grad)


def set_grad_enabled_forms(x):
    with torch.set_grad_enabled(True):
        @torch.set_grad_enabled(False)
        def inner(y):
            return y.cos()

        still = torch.is_grad_enabled()
    outside = torch.set_grad_enabled(False)(lambda y: y * 3)
    return inner(x), still, outside(x), torch.is_grad_enabled(), (x + 1).requires_grad


def restored_when_wrapped_call_raises(x):
    @torch.no_grad()
    def boom(y):
        z = y * 2
        raise ValueError(z.requires_grad)

    try:
        boom(x)
    except ValueError as e:
        flag = e.args[0]
    return x * 5, flag, torch.is_grad_enabled()


@pytest.mark.parametrize("fn", [call_forms, set_grad_enabled_forms,
                                restored_when_wrapped_call_raises], ids=lambda f: f.__name__)
def test_grad_mode_decorator_like_eager(fn):
    ours, theirs = _check(fn)
    assert ours == 2 and theirs <= ours, (ours, theirs)

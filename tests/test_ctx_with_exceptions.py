"""Exceptions raised at trace time inside a `with` block reach the context manager's
`__exit__(type, value, traceback)` (WITH_EXCEPT_START), compiled vs eager: user classes that
swallow, inspect or re-raise, grad mode / autocast restored on the way out, nesting and
inlined functions; contextmanager generators have it thrown into them (more in
test_contextmanager_exceptions.py). Values, grad/autocast state after the call
and graph counts are compared with eager and torch.compile."""

import contextlib

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Swallow:
    def __init__(self):
        self.log = []

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, et, ev, tb):
        self.log.append((et, ev.args if ev is not None else None, tb is None))
        return True


class Passes:
    def __init__(self):
        self.seen = []

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        self.seen.append(et)
        return False


class RaisesInExit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        raise KeyError("from exit")


@contextlib.contextmanager
def gen_ctx(x):
    try:
        yield x.sin()
    finally:
        pass


def _state():
    return torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.requires_grad == want.requires_grad
        torch.testing.assert_close(got.detach(), want.detach())
    else:
        assert got == want


def run_both(fn, rg=True):
    def args():
        return (torch.randn(4, 4, generator=torch.Generator().manual_seed(0)).requires_grad_(rg),)
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    for _ in range(3):
        want, state_want = fn(*args()), _state()
        got, state_got = cf(*args()), _state()
        _same(got, want)
        assert state_got == state_want == (True, False)
    torch._dynamo.reset()
    torch.compile(fn, backend=theirs)(*args())
    torch._dynamo.reset()
    return ours.count, theirs.count


def test_user_exit_swallows_and_sees_the_exception():
    def fn(x):
        s = Swallow()
        with s:
            y = x + 1
            raise ValueError("m", 2)
        return y, s.log

    assert run_both(fn) == (1, 1)


def test_user_exit_returning_false_lets_it_propagate():
    def fn(x):
        p = Passes()
        try:
            with p:
                raise KeyError("k")
        except KeyError:
            y = x * 2
        return y, p.seen

    assert run_both(fn) == (1, 1)


def test_exception_from_exit_replaces_the_one_raised():
    def fn(x):
        try:
            with RaisesInExit():
                raise ValueError
        except KeyError as e:
            return x + 1, e.args
        return x

    assert run_both(fn) == (1, 1)


def test_no_grad_and_autocast_restored_by_the_exception():
    def fn(x):
        try:
            with torch.no_grad():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    y = x @ x
                    raise ValueError
        except ValueError:
            z = x * 3
        return y, z, torch.is_grad_enabled()

    assert run_both(fn) == (1, 1)


def test_inner_swallows_inside_no_grad_then_raise_in_inlined_function():
    def inner(x):
        with torch.no_grad():
            raise ValueError("a")

    def fn(x):
        s = Swallow()
        with torch.no_grad():
            with s:
                y = x * 2
                raise ValueError
            z = x * 3
        try:
            inner(x)
        except ValueError:
            pass
        return y, z, x * 4, s.log

    assert run_both(fn) == (1, 1)


def test_contextlib_suppress():
    def fn(x):
        with contextlib.suppress(KeyError, ValueError):
            y = x * 2
            raise ValueError
        return x + 1

    assert run_both(fn) == (1, 1)


def test_exception_in_contextmanager_generator_is_thrown_into_it():
    def fn(x):
        try:
            with gen_ctx(x) as y:
                raise KeyError("k")
        except KeyError:
            y = x.cos()
        return y

    assert run_both(fn) == (1, 1)


def test_exception_escaping_the_frame_raises_like_eager():
    def fn(x):
        with torch.no_grad():
            raise ValueError("out")

    with pytest.raises(ValueError, match="out"):
        ferrodyn.compile(fn, backend=CountingBackend())(torch.ones(2, requires_grad=True))
    assert torch.is_grad_enabled()

"""Writable attributes of a function that a trace inlines: `__code__`, `__defaults__`,
`__kwdefaults__` reassigned on the same function object after it was compiled must be seen on
the next call (a guard fails and the frame recompiles), for a function handed in as an argument,
a global helper, a method on a class and a closure. Each test compares the compiled result with
eager after every change, counts one compile per change, and compares the count with
torch.compile's over the same calls where torch.compile sees the change (it misses a method's
new `__code__`)."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _code_a(y, s=2.0, *, t=1.0):
    return y * s + t


def _code_b(y, s=2.0, *, t=1.0):
    return y - s - t


def _fresh_fn():
    def g(y, s=2.0, *, t=1.0):
        return y * s + t
    return g


def helper(y, s=2.0, *, t=1.0):
    return y * s + t


class Box:
    def run(self, y):
        return y * 3


def _by_argument(x, g):
    return g(x) + 1


def _by_global(x):
    return helper(x) + 1


def _by_method(x, box):
    return box.run(x) + 1


_HELPER_CODE = helper.__code__
_RUN_CODE = Box.run.__code__


def _check(fn, args_of, changes, compiles=None) -> bool:
    """Call eager / ferrodyn / torch.compile once, then after each change: ferrodyn's results
    must be eager's, and where torch.compile's are too, ferrodyn compiles no more often than
    it. Returns whether torch.compile gave eager's results."""
    torch._dynamo.reset()
    bf, bt = CountingBackend(), CountingBackend()
    cf, ct = ferrodyn.compile(fn, backend=bf), torch.compile(fn, backend=bt)
    x = torch.ones(3)
    torch_right = True
    try:
        for change in [None, *changes]:
            if change is not None:
                change()
            want = fn(x, *args_of())
            assert torch.equal(cf(x, *args_of()), want), change
            torch_right &= torch.equal(ct(x, *args_of()), want)
    finally:
        helper.__code__ = _HELPER_CODE
        Box.run.__code__ = _RUN_CODE
        torch._dynamo.reset()
    # one compile per new state (a change back to an earlier state hits its entry again)
    assert bf.count == (1 + len(changes) if compiles is None else compiles), bf.count
    if torch_right:
        assert bf.count <= bt.count, (bf.count, bt.count)
    return torch_right


def test_code_of_an_argument_function_reassigned():
    g = _fresh_fn()

    def swap():
        g.__code__ = _code_b.__code__

    _check(_by_argument, lambda: (g,), [swap])


def test_defaults_and_kwdefaults_of_an_argument_function_reassigned():
    g = _fresh_fn()

    def defaults():
        g.__defaults__ = (5.0,)

    def kwdefaults():
        g.__kwdefaults__ = {"t": 7.0}

    _check(_by_argument, lambda: (g,), [defaults, kwdefaults])


def test_code_of_a_global_helper_reassigned():
    def swap():
        helper.__code__ = _code_b.__code__

    def back():
        helper.__code__ = _HELPER_CODE

    _check(lambda x: _by_global(x), lambda: (), [swap, back], compiles=2)


def test_code_of_a_method_reassigned():
    box = Box()

    def swap():
        Box.run.__code__ = (lambda self, y: y - 10).__code__

    # torch.compile (2.15) keeps running the old code of a method here
    _check(_by_method, lambda: (box,), [swap])


def test_code_of_a_closure_reassigned():
    k = torch.tensor(4.0)

    def g(y):
        return y + k

    def other(y):
        return y * k

    def swap():
        g.__code__ = other.__code__

    _check(_by_argument, lambda: (g,), [swap])

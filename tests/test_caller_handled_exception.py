"""The exception the compiled frame's caller is handling: a raise in the frame chains to it
(`__context__`), `sys.exc_info()` and a bare `raise` see it. A trace made while the caller
handles none relies on that under a guard (`sys.exception() is None`); called from inside an
`except` block the guard fails and the frame runs eagerly (never the cached answer). Compiled
vs eager (values, exception type/message), graph counts vs torch.compile, guard outcome."""

import sys

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def fn(x):
    try:
        raise KeyError("k")
    except KeyError as e:
        ctx = e.__context__
    info = sys.exc_info()[0]
    return x + 1, type(ctx).__name__, info


def bare_raise(x):
    y = x * 2
    raise


def _calls(f):
    """f called outside any handler, inside one, and outside again."""
    x = torch.arange(3.0)
    out = [f(x)]
    try:
        raise ValueError("outer")
    except ValueError:
        out.append(f(x))
    out.append(f(x))
    return out


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g[0], w[0]) and g[1:] == w[1:], (g, w)


def test_context_and_exc_info_follow_the_caller():
    want = _calls(fn)
    assert want[0][1:] == ("NoneType", None) and want[1][1:] == ("ValueError", ValueError)
    ours, theirs = CountingBackend(), CountingBackend()
    _same(_calls(ferrodyn.compile(fn, backend=ours)), want)
    torch._dynamo.reset()
    _calls(torch.compile(fn, backend=theirs))
    torch._dynamo.reset()
    # one graph for the calls outside a handler; the call inside one ran eagerly
    assert ours.count == 1 and theirs.count == 1


def test_guard_says_why_it_fails():
    compiled = ferrodyn.compile(fn, backend=CountingBackend())
    compiled(torch.arange(3.0))
    [entry] = ferrodyn._C.cache_entries(fn.__code__)
    assert "sys.exception() is None" in entry.guards.leaves()
    try:
        raise ValueError
    except ValueError:
        args = (torch.arange(3.0),)
        assert not entry.guards.check(args, fn.__globals__, __builtins__.__dict__
                                      if hasattr(__builtins__, "__dict__") else __builtins__, ())
    assert entry.guards.check((torch.arange(3.0),), fn.__globals__,
                              __builtins__.__dict__ if hasattr(__builtins__, "__dict__")
                              else __builtins__, ())


def test_bare_raise_in_frame_raises_what_the_caller_handles():
    compiled = ferrodyn.compile(bare_raise, backend=CountingBackend())
    for f in (bare_raise, compiled):
        with pytest.raises(RuntimeError, match="No active exception to reraise"):
            f(torch.ones(2))
        try:
            raise IndexError("handled by the caller")
        except IndexError:
            with pytest.raises(IndexError, match="handled by the caller"):
                f(torch.ones(2))

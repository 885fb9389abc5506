"""`torch.autograd._profiler_enabled()` reads the autograd profiler's global state, which no
guard covers: ferrodyn must not fold it into a cache entry (a frame compiled with the profiler
off and called with it on would take the wrong branch). Compiled vs eager, both profiler
states, graph counts vs torch.compile."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def fn(x):
    if torch.autograd._profiler_enabled():
        return x + 1
    return x - 1


def _run(compiled):
    x = torch.zeros(3)
    out = [compiled(x)]
    with torch.autograd.profiler.profile():
        out.append(compiled(x))
    out.append(compiled(x))
    return out


def test_profiler_enabled_follows_the_profiler_state():
    want = _run(fn)
    ours, theirs = CountingBackend(), CountingBackend()
    got = _run(ferrodyn.compile(fn, backend=ours))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert torch.equal(want[1], torch.ones(3)) and torch.equal(want[0], -torch.ones(3))
    torch._dynamo.reset()
    _run(torch.compile(fn, backend=theirs))
    torch._dynamo.reset()
    assert ours.count == theirs.count == 2

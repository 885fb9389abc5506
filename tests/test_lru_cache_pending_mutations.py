"""A call of an lru_cache wrapper while mutations are pending in the trace (transformers'
`is_torch_distributed_available()` / `is_torch_greater_or_equal("2.9.0")` after
`self.config.is_causal = ...`): made at trace time only where it provably reads no state the
frame changed (a function marked constant for the process; a cache hit of a function that takes
no arguments), refused (a graph break, the body then runs as eager) otherwise. Compiled vs
eager (results and mutated state, the body's runs), graph counts against torch.compile's."""

import functools

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

STATE = {"on": False}
RUNS = []


@functools.lru_cache
def flag():
    RUNS.append("flag")
    return STATE["on"]  # reads state the frame mutates


def _constant(fn):
    fn._dynamo_marked_constant = True  # torch._dynamo.assume_constant_result's marker
    return fn


@functools.lru_cache
@_constant
def version_at_least(v):
    RUNS.append(v)
    return v <= "2.0"


def sets_then_reads_flag(x):
    y = x.sin()  # a graph op before the call: a break there makes two graphs
    STATE["on"] = True
    return y + 1 if flag() else y - 1


def sets_then_reads_marked(x):
    y = x.sin()
    STATE["on"] = True
    return y * 2 if version_at_least("1.5") else y


def _compare(fn, prime):
    """fn eagerly, through ferrodyn.compile and torch.compile, each from the same state (cache
    primed by `prime` or cleared): ferrodyn's results, STATE and the body's runs equal eager's
    (torch.compile traces `__wrapped__` past the cache: a primed cache's stale value is not what
    it returns). Returns (ferrodyn graphs, torch.compile graphs, eager's body runs)."""
    got = {}
    counts = {}
    for name in ("eager", "ferrodyn", "torch"):
        torch._dynamo.reset()
        ferrodyn.reset()
        STATE["on"] = False
        flag.cache_clear()
        version_at_least.cache_clear()
        prime()
        RUNS.clear()
        backend = CountingBackend()
        f = {"eager": fn, "ferrodyn": ferrodyn.compile(fn, backend=backend),
             "torch": torch.compile(fn, backend=backend)}[name]
        x = torch.arange(3.0)
        outs = [f(x) for _ in range(3)]
        got[name] = (outs, dict(STATE), list(RUNS))
        counts[name] = backend.count
    for a, b in zip(got["ferrodyn"][0], got["eager"][0]):
        torch.testing.assert_close(a, b)
    assert got["ferrodyn"][1:] == got["eager"][1:]
    return counts["ferrodyn"], counts["torch"], got["eager"][2]


def test_zero_argument_cache_hit_is_read_with_mutations_pending():
    ours, theirs, runs = _compare(sets_then_reads_flag, prime=flag)
    assert runs == []  # every eager call is a hit: the body never runs
    assert ours <= theirs and ours == 1


def test_zero_argument_cache_miss_waits_for_pending_mutations():
    # the cache is empty: the first call runs the body, which must see STATE["on"] = True
    ours, theirs, runs = _compare(sets_then_reads_flag, prime=lambda: None)
    assert runs == ["flag"]
    assert ours == 2  # refused at trace time: a graph break before the call


def test_marked_constant_call_with_mutations_pending_is_one_graph():
    ours, theirs, runs = _compare(sets_then_reads_marked, prime=lambda: None)
    assert runs == ["1.5"]  # the capturing run's own call: a miss, as eager's first call
    assert ours <= theirs and ours == 1

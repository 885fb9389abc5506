"""A cache hit's direct call (rust/cache/direct.rs, codegen.direct_call): an entry that only
returns `graph(*inputs)[k]` is called by the hook without running the entry function's frame.
The results, the exceptions and the fence (the thread's callback inside the graph) are those
of the entry function; a trace or profile function sees the entry's frame as before; entries
with anything more (side effects, outputs other than one graph item) keep running the entry
function. Also the module call's native pieces (the forward called with the module first, no
bound method; JIT tracing read through torch's C++ reader)."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
import torch._dynamo

import ferrodyn
from ferrodyn import _C
from counting_backend import CountingBackend


@pytest.fixture(autouse=True)
def _fresh(fresh_ferrodyn):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, scale=1.0):
        for layer in self.layers:
            x = torch.relu(layer(x)) * scale
        return x


def _entries(code):
    return _C.cache_entries(code)


def test_module_entry_is_direct_and_matches_eager():
    m, x = _MLP(), torch.randn(2, 4)
    be, tb = CountingBackend(), CountingBackend()
    fd, tc = ferrodyn.compile(m, backend=be), torch.compile(m, backend=tb)
    for _ in range(3):  # a miss, then hits
        assert torch.allclose(fd(x), m(x)) and torch.allclose(tc(x), m(x))
    (e,) = _entries(_MLP.forward.__code__)
    assert e.has_direct_call
    for f in (fd, tc):
        # keyword arguments (the module path copies them with the module first)
        assert torch.allclose(f(x, scale=2.0), m(x, scale=2.0))
        assert torch.allclose(f(x=x), m(x=x))
        # a vectorcall without the offset slot (map calls the module that way)
        assert all(torch.allclose(a, b) for a, b in zip(map(f, [x, x + 1]), map(m, [x, x + 1])))
    # a parameter changed in place is seen (the graph reads what the tree exported)
    with torch.no_grad():
        m.layers[0].weight.add_(1.0)
    assert torch.allclose(fd(x), m(x)) and torch.allclose(tc(x), m(x))
    assert be.count == tb.count


def test_function_entries_direct_only_when_the_entry_is_just_the_graph():
    def plain(a, b):
        return (a * b).sum(0)

    def two_outputs(a, b):
        return a + b, a - b

    holder = {"last": None}

    def with_effect(a, b):
        holder["last"] = 1
        return a + b

    a, b = torch.randn(3, 2), torch.randn(3, 2)
    for fn, direct in ((plain, True), (two_outputs, False), (with_effect, False)):
        c = ferrodyn.compile(fn, backend="eager")
        want = fn(a, b)
        for _ in range(2):
            got = c(a, b)
            if isinstance(want, tuple):
                assert all(torch.equal(g, w) for g, w in zip(got, want))
            else:
                assert torch.equal(got, want)
        (e,) = _entries(fn.__code__)
        assert e.has_direct_call is direct, fn.__name__
        holder["last"] = None
    c = ferrodyn.compile(with_effect, backend="eager")
    c(a, b)
    assert holder["last"] == 1  # the side effect runs on a hit (the entry function's work)


def _recording_backend(seen):
    """A backend whose compiled callable records its caller's code and the thread's callback
    (not an fx forward, so the entry fences it)."""
    def backend(gm, example_inputs):
        def run(*args):
            seen.append((sys._getframe(1).f_code, _C.get_eval_frame()))
            return gm.forward(*args)
        return run
    return backend


def test_direct_call_skips_the_entry_frame_and_keeps_the_fence():
    def f(x, y):
        return torch.sin(x) + y

    seen = []
    c = ferrodyn.compile(f, backend=_recording_backend(seen))
    x, y = torch.randn(3), torch.randn(3)
    assert torch.equal(c(x, y), f(x, y))  # the miss runs the entry function
    (e,) = _entries(f.__code__)
    assert e.has_direct_call
    entry_code = e.fn.__code__
    assert seen[-1] == (entry_code, False)
    assert torch.equal(c(x, y), f(x, y))  # a hit: no entry frame, the same fence
    code, callback = seen[-1]
    assert code is not entry_code and callback is False
    assert _C.get_eval_frame() is None


@pytest.mark.parametrize("setter", [sys.settrace, sys.setprofile])
def test_trace_and_profile_functions_see_the_entry_frame(setter):
    def f(x):
        return torch.cos(x) * 2

    seen = []
    c = ferrodyn.compile(f, backend=_recording_backend(seen))
    x = torch.randn(3)
    c(x)
    (e,) = _entries(f.__code__)
    calls = []

    def tracer(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code)
        return None

    setter(tracer)
    try:
        got = c(x)
    finally:
        setter(None)
    assert torch.equal(got, f(x))
    assert seen[-1][0] is e.fn.__code__ and e.fn.__code__ in calls


def test_exception_in_the_graph_propagates_from_the_direct_call():
    def f(x, y):
        return x @ y

    c = ferrodyn.compile(f, backend="eager")
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    assert torch.equal(c(a, b), f(a, b))
    c(a, b)
    assert _entries(f.__code__)[0].has_direct_call
    # a backend's graph that raises on a hit (the guards still pass)
    calls = []

    def flaky(gm, example_inputs):
        def run(*args):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("graph failed on a hit")
            return gm.forward(*args)
        return run

    ferrodyn.reset()
    c = ferrodyn.compile(f, backend=flaky)
    assert torch.equal(c(a, b), f(a, b))
    with pytest.raises(RuntimeError, match="graph failed on a hit"):
        c(a, b)
    assert _C.get_eval_frame() is None


def test_graph_returning_a_list_is_indexed_like_the_entry():
    def f(x):
        return x.relu() + 1

    def list_backend(gm, example_inputs):
        def run(*args):
            return list(gm.forward(*args))
        return run

    c = ferrodyn.compile(f, backend=list_backend)
    x = torch.randn(4)
    for _ in range(3):
        assert torch.equal(c(x), f(x))
    assert _entries(f.__code__)[0].has_direct_call


def test_direct_call_plan_is_validated():
    tree = _C.GuardBuilder({}).build()
    with pytest.raises(TypeError, match="direct must be"):
        _C.CacheEntry(lambda: None, tree, direct=(len, ((True, 0),), 0))
    with pytest.raises(TypeError, match="must be callable"):
        _C.CacheEntry(lambda: None, tree, direct=(3, (), 0, False))
    assert not _C.CacheEntry(lambda: None, tree).has_direct_call


def test_jit_tracing_is_read_like_torch():
    seen = []

    def f(x):
        seen.append((_C._debug_is_tracing()[0], torch._C._is_tracing()))
        return x + 1

    assert _C._debug_is_tracing()[0] is False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(f, torch.randn(2))
    assert seen and all(a == b for a, b in seen) and any(a for a, _ in seen)
    assert _C._debug_is_tracing()[0] is False


def test_module_traced_by_jit_takes_the_hooked_path():
    m, x = _MLP(), torch.randn(2, 4)
    fd = ferrodyn.compile(m, backend="eager")
    fd(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(fd, x, check_trace=False)
    assert torch.allclose(traced(x), m(x))


# -- the native call path's look-up before any frame (rust/eval_frame/cached_call.rs) ---------

def _offered():
    return _C._debug_hook_state()["offered"]


def test_compiled_function_hit_runs_without_a_frame_and_misses_take_the_hook():
    def f(a, b):
        return a * 2 + b

    be, tb = CountingBackend(), CountingBackend()
    c, t = ferrodyn.compile(f, backend=be), torch.compile(f, backend=tb)
    a, b = torch.randn(3), torch.randn(3)
    assert torch.equal(c(a, b), f(a, b)) and torch.equal(t(a, b), f(a, b))
    before, stats = _offered(), _C.cache_stats()
    for _ in range(5):
        assert torch.equal(c(a, b), f(a, b))
    assert _offered() == before  # looked up before the frame: the hook saw nothing
    assert _C.cache_stats()["hits"] == stats["hits"] + 5
    # a new shape: the look-ahead misses without counting, the hook counts once and compiles
    a2, b2 = torch.randn(4, 2), torch.randn(4, 2)
    assert torch.equal(c(a2, b2), f(a2, b2)) and torch.equal(t(a2, b2), f(a2, b2))
    assert _C.cache_stats()["guard_failures"] == stats["guard_failures"] + 1
    assert be.count == tb.count


def test_calls_the_look_up_cannot_take_go_through_the_frame():
    def with_default(a, b=None):
        return a + 1 if b is None else a + b

    k = torch.ones(3)

    def closure(a):
        return a * k

    a = torch.randn(3)
    for fn, call, framed in ((with_default, lambda c: c(a), False),     # a default fills a slot
                             (with_default, lambda c: c(a, a), False),  # all positional
                             (with_default, lambda c: c(a, b=a), True),  # keywords
                             (closure, lambda c: c(a), True)):           # a closure
        ferrodyn.reset()
        c = ferrodyn.compile(fn, backend="eager")
        want = call(fn)
        assert torch.equal(call(c), want)
        before = _offered()
        assert torch.equal(call(c), want)
        assert _offered() == before + framed, fn.__name__


def test_defaults_are_read_at_each_call():
    def f(a, b=None, scale=2):
        return a * scale if b is None else (a + b) * scale

    be, tb = CountingBackend(), CountingBackend()
    c, t = ferrodyn.compile(f, backend=be), torch.compile(f, backend=tb)
    a = torch.randn(3)
    for g in (c, t):
        assert torch.equal(g(a), a * 2) and torch.equal(g(a), a * 2)
    f.__defaults__ = (torch.ones(3), 3)
    for g in (c, t):
        assert torch.equal(g(a), (a + 1) * 3) and torch.equal(g(a), (a + 1) * 3)
    f.__defaults__ = (None, 2)
    assert torch.equal(c(a), a * 2)
    assert be.count == tb.count


def test_reassigned_code_is_read_afresh():
    def f(x):
        return x + 1

    def g(x):
        return x - 1

    c = ferrodyn.compile(f, backend="eager")
    x = torch.randn(3)
    assert torch.equal(c(x), x + 1)
    assert torch.equal(c(x), x + 1)
    f.__code__ = g.__code__
    assert torch.equal(c(x), x - 1)
    assert torch.equal(c(x), x - 1)


def test_trace_function_sees_the_frame_of_a_hit():
    def f(x):
        return x.exp()

    c = ferrodyn.compile(f, backend="eager")
    x = torch.randn(3)
    c(x)
    calls = []

    def tracer(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.settrace(tracer)
    try:
        got = c(x)
    finally:
        sys.settrace(None)
    assert torch.equal(got, x.exp()) and "f" in calls


def test_module_hit_without_a_frame_and_with_keywords():
    m, x = _MLP(), torch.randn(2, 4)
    fd = ferrodyn.compile(m, backend="eager")
    fd(x)
    fd(x)  # the first hit stamps the module's "no hooks" verdicts
    # The stamps are proven by dict version tags, which 3.13 no longer changes for every
    # attribute store (rust/ffi/guard_reads.rs): there the module path calls forward (a frame).
    framed = sys.version_info >= (3, 13)
    before = _offered()
    assert torch.allclose(fd(x), m(x))
    assert _offered() == before + framed
    assert torch.allclose(fd(x, scale=3.0), m(x, scale=3.0))  # keywords: the frame path
    assert _offered() > before + framed
    # a hook added later is honoured (the look-up only runs on the hook-free path)
    h = m.register_forward_hook(lambda mod, args, out: out * 0)
    try:
        assert torch.equal(fd(x), torch.zeros(2, 4))
    finally:
        h.remove()
    assert torch.allclose(fd(x), m(x))

"""The PEP 523 frame hook (rust/eval_frame, rust/ffi/frame*.rs): which frames are intercepted,
what the callback sees, what runs on a hit, and that errors, interrupts, threads and reference
counts all come out right. Cache bookkeeping itself is tested in test_cache.py."""

import asyncio
import gc
import signal
import sys
import threading
import traceback
import tracemalloc
import weakref

import pytest

from ferrodyn import _C
from hook_helpers import Recorder, always_tree, callback, type_tree


pytestmark = pytest.mark.usefixtures("clean_hook_cache")


def add(a, b):
    return a + b


def outer(x):
    return add(x, 1) * 2


def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)


# -- set_eval_frame / get_eval_frame -----------------------------------------------------------

def test_set_returns_previous_and_get_reads_it():
    cb = Recorder()
    assert _C.get_eval_frame() is None
    assert _C.set_eval_frame(cb) is None
    assert _C.get_eval_frame() is cb
    assert _C.set_eval_frame(False) is cb
    assert _C.get_eval_frame() is False
    assert _C.set_eval_frame(None) is False
    assert _C.get_eval_frame() is None


@pytest.mark.parametrize("bad", [True, 1, "cb", object()])
def test_set_rejects_non_callables(bad):
    with pytest.raises(TypeError, match="None, False or a callable"):
        _C.set_eval_frame(bad)
    assert _C.get_eval_frame() is None


def test_hook_installed_only_while_a_callback_is_set():
    assert not _C._debug_hook_state()["installed"]
    _C.set_eval_frame(Recorder())
    st = _C._debug_hook_state()
    assert st["installed"] and st["active_threads"] == 1
    _C.set_eval_frame(False)
    assert _C._debug_hook_state()["installed"]
    _C.set_eval_frame(None)
    st = _C._debug_hook_state()
    assert not st["installed"] and st["active_threads"] == 0


# -- interception --------------------------------------------------------------------------------

def test_nested_calls_are_intercepted_in_call_order():
    rec = Recorder()
    with callback(rec):
        r = outer(3)
    assert r == outer(3) == 8
    assert rec.names() == ["outer", "add"]
    assert rec.views[0].args == (3,) and rec.views[1].args == (3, 1)


def test_recursion_intercepts_every_level():
    rec = Recorder()
    with callback(rec):
        assert fact(6) == 720
    assert rec.names() == ["fact"] * 6
    assert [v.args for v in rec.views] == [(n,) for n in range(6, 0, -1)]


def test_frame_view_contents():
    def mk():
        z = 10

        def f(a, b=2, *rest, k, kd=5, **kw):
            return a + b + k + kd + z + len(rest) + len(kw)
        return f

    f = mk()
    rec = Recorder()
    with callback(rec):
        r = f(1, 3, 4, k=7, extra=1)
    assert r == f(1, 3, 4, k=7, extra=1)
    (v,) = [v for v in rec.views if v.f_code is f.__code__]
    assert v.f_globals is f.__globals__
    assert v.f_builtins is __builtins__ or v.f_builtins is getattr(__builtins__, "__dict__", None)
    assert v.args == (1, 3, 7, 5, (4,), {"extra": 1})
    assert v.closure == f.__closure__ and v.closure[0].cell_contents == 10
    assert v.f_locals == {"a": 1, "b": 3, "k": 7, "kd": 5, "rest": (4,), "kw": {"extra": 1}}
    assert v.f_locals is v.f_locals  # built once


def test_callback_frames_run_unchanged():
    def helper(x):
        return x + 1

    seen = []

    def cb(view):
        if view.f_code.co_filename != __file__:
            return None
        seen.append(view.f_code.co_name)
        assert _C.get_eval_frame() is cb
        helper(1)  # a Python frame run by the callback: not intercepted
        return None

    with callback(cb):
        assert outer(1) == 4
        assert helper(2) == 3
    assert seen == ["outer", "add", "helper"]


def gen(n):
    for i in range(n):
        yield add(i, 0)


async def coro(x):
    await asyncio.sleep(0)
    return add(x, 1)


async def agen(n):
    for i in range(n):
        yield i


def test_generators_coroutines_async_generators_run_unchanged():
    async def collect():
        return [i async for i in agen(3)]

    # An entry for everything but add(): generator frames must never get one.
    rec = Recorder(lambda v: None if v.f_code is add.__code__ else
                   _C.CacheEntry(lambda *a: "WRONG", always_tree()))
    with callback(rec):
        assert list(gen(3)) == [0, 1, 2]
        g = gen(2)
        next(g)
        with pytest.raises(ValueError):
            g.throw(ValueError("x"))  # resumed with throwflag
    assert "gen" not in rec.names()
    # add() ran inside the generator: a plain call, intercepted.
    assert rec.names().count("add") == 4
    rec2 = Recorder(lambda v: None if v.f_code is add.__code__ else
                    _C.CacheEntry(lambda *a: "WRONG", always_tree()))
    with callback(rec2):
        assert asyncio.run(coro(1)) == 2
        assert asyncio.run(collect()) == [0, 1, 2]
    assert "coro" not in rec2.names() and "agen" not in rec2.names()
    assert "collect" not in rec2.names() and "add" in rec2.names()


def test_callback_returning_entry_runs_it_and_next_call_hits():
    calls = []

    def compiled(a, b):
        calls.append((a, b))
        return ("compiled", a + b)

    rec = Recorder(lambda v: _C.CacheEntry(compiled, always_tree()) if v.f_code is add.__code__ else None)
    every = []

    def cb(view):
        every.append(view.f_code)
        return rec(view)

    with callback(cb):
        assert add(1, 2) == ("compiled", 3)
        assert add(5, 6) == ("compiled", 11)
    assert rec.names() == ["add"]  # second call was a hit; compiled's own frame not intercepted
    assert calls == [(1, 2), (5, 6)]
    # The miss counter counts every callback call, including frames Recorder ignores (on
    # 3.12, an audit hook installed by an import elsewhere): compare with its own count.
    assert _C.cache_stats()["hits"] == 1 and _C.cache_stats()["misses"] == len(every)


def test_hit_passes_varargs_kwargs_and_closure_cells():
    def mk():
        c1, c2 = "one", "two"

        def f(a, *args, k=0, **kw):
            return (a, args, k, kw, c1, c2)
        return f

    f = mk()
    got = []

    def compiled(*slots):
        got.append(slots)
        return "hit"

    _C.insert_entry(f.__code__, _C.CacheEntry(compiled, always_tree()))
    with callback(False):
        assert f(1, 2, 3, k=4, z=5) == "hit"
    (slots,) = got
    # co_varnames order: positional, keyword-only, then *args and **kwargs.
    assert slots[:4] == (1, 4, (2, 3), {"z": 5})
    assert slots[4:] == f.__closure__
    assert [c.cell_contents for c in slots[4:]] == ["one", "two"]


def test_callback_must_return_entry_or_none():
    with callback(lambda v: 42 if v.f_code is add.__code__ else None):
        with pytest.raises(TypeError, match="CacheEntry or None, got int"):
            add(1, 2)


def test_run_only_mode_never_calls_callback_but_uses_entries():
    _C.insert_entry(add.__code__, _C.CacheEntry(lambda a, b: "cached", always_tree()))
    with callback(False):
        assert add(1, 2) == "cached"
        assert outer(1) == "cachedcached"  # outer has no entry: runs normally
    assert _C.cache_stats()["misses"] == 0


# -- backends ------------------------------------------------------------------------------------

def _backend_entry(tag, backend_id):
    return _C.CacheEntry(lambda a, b: (tag, a + b), always_tree(), backend_id=backend_id)


def test_backend_callback_is_returned_as_prior_and_restores_its_backend():
    rec = Recorder()
    bc = _C.BackendCallback(rec, 3)
    assert bc.callback is rec and bc.backend_id == 3
    assert _C.set_eval_frame(bc) is None
    assert _C.get_eval_frame() is bc
    assert _C.set_eval_frame(None) is bc
    with pytest.raises(TypeError, match="callable"):
        _C.BackendCallback(1, 3)
    with pytest.raises(TypeError, match="callable"):
        _C.BackendCallback(bc, 4)
    with pytest.raises(ValueError, match=">= 0"):
        _C.BackendCallback(rec, -1)


def test_lookup_runs_only_entries_of_the_current_backend():
    _C.insert_entry(add.__code__, _backend_entry("b1", 1))
    _C.insert_entry(add.__code__, _backend_entry("b2", 2))  # front
    compiled = {}

    def compiler(bid):
        def cb(view):
            if view.f_code is not add.__code__:
                return None
            compiled[bid] = compiled.get(bid, 0) + 1
            return _backend_entry(f"new{bid}", bid)
        return _C.BackendCallback(cb, bid)

    with callback(compiler(1)):
        assert add(1, 2) == ("b1", 3)  # b2's entry is in front but not for backend 1
    assert _C.cache_stats()["guard_failures"] == 0  # the other backend's entry is not checked
    with callback(compiler(2)):
        assert add(1, 2) == ("b2", 3)
    with callback(compiler(3)):  # no entry for backend 3: a miss compiles one...
        assert add(1, 2) == ("new3", 3)
        assert add(1, 2) == ("new3", 3)  # ...which hits afterwards
    assert compiled == {3: 1}
    assert [e.backend_id for e in _C.cache_entries(add.__code__)] == [3, 2, 1]
    # A restore through the prior object keeps the backend: nested wrappers of two backends.
    with callback(compiler(1)):
        with callback(compiler(2)):
            assert add(1, 1) == ("b2", 2)
        assert add(1, 1) == ("b1", 2)
    assert compiled == {3: 1}


def test_backend_zero_and_run_only_match_every_backend():
    # Run-only (False) and plain callables accept entries of any backend, as torch's run-only
    # mode does; an entry with backend id 0 runs for every backend.
    _C.insert_entry(add.__code__, _backend_entry("b5", 5))
    with callback(False):
        assert add(1, 2) == ("b5", 3)
    rec = Recorder()
    with callback(rec):
        assert add(1, 2) == ("b5", 3)
    assert rec.views == []
    _C.reset()
    _C.insert_entry(add.__code__, _backend_entry("any", 0))
    with callback(_C.BackendCallback(rec, 7)):
        assert add(1, 2) == ("any", 3)
    assert rec.views == []


def test_limit_counts_every_backends_entries():
    _C.set_cache_size_limit(2)
    _C.insert_entry(add.__code__, _backend_entry("b1", 1))
    _C.insert_entry(add.__code__, _backend_entry("b2", 2))
    rec = Recorder(lambda v: _backend_entry("b3", 3))
    with callback(_C.BackendCallback(rec, 3)):
        with pytest.warns(RuntimeWarning, match="cache size limit"):
            assert add(1, 2) == 3  # at the limit: runs normally, the callback is not called
    assert rec.views == []


def test_backend_hits_leave_refcounts_unchanged():
    a, b = object(), object()

    def compiled(x, y):
        return x

    def g(x, y):
        return None

    entry = _C.CacheEntry(compiled, always_tree(), backend_id=4)
    _C.insert_entry(g.__code__, _C.CacheEntry(lambda x, y: y, always_tree(), backend_id=9))
    _C.insert_entry(g.__code__, entry)
    bc = _C.BackendCallback(Recorder(), 4)
    refs = [sys.getrefcount(o) for o in (a, b, compiled, entry, bc)]
    with callback(bc):
        for _ in range(1000):
            assert g(a, b) is a
    assert [sys.getrefcount(o) for o in (a, b, compiled, entry, bc)] == refs
    assert entry.hits == 1000


# -- flags ---------------------------------------------------------------------------------------

def test_skip_code_is_never_intercepted_even_with_entries():
    def f(x):
        return x

    _C.insert_entry(f.__code__, _C.CacheEntry(lambda x: "cached", always_tree()))
    _C.skip_code(f.__code__)
    assert _C.code_flags(f.__code__) == "skip"
    rec = Recorder()
    with callback(rec):
        assert f(3) == 3
    assert rec.views == []


def test_run_only_code_uses_entries_but_never_the_callback():
    def f(x):
        return x

    _C.run_only_code(f.__code__)
    assert _C.code_flags(f.__code__) == "run_only"
    rec = Recorder(lambda v: _C.CacheEntry(lambda x: "compiled", always_tree()))
    with callback(rec):
        assert f(3) == 3
        _C.insert_entry(f.__code__, _C.CacheEntry(lambda x: ("cached", x), always_tree()))
        assert f(4) == ("cached", 4)
    assert [v for v in rec.views if v.f_code is f.__code__] == []
    assert _C.code_flags(add.__code__) == "default"


def test_flag_functions_reject_non_code():
    for fn in (_C.skip_code, _C.run_only_code, _C.code_flags):
        with pytest.raises(TypeError):
            fn(add)


# -- exceptions ----------------------------------------------------------------------------------

def raiser(x):
    raise ValueError(f"eager {x}")


def test_exception_from_eager_frame_has_its_traceback():
    rec = Recorder()
    with callback(rec):
        with pytest.raises(ValueError, match="eager 3") as ei:
            raiser(3)
    names = [f.name for f in traceback.extract_tb(ei.value.__traceback__)]
    assert names[-1] == "raiser"
    assert rec.names() == ["raiser"]


def test_exception_from_entry_propagates_with_entry_frames_in_traceback():
    def compiled_body(x):
        raise KeyError(f"from entry {x}")

    _C.insert_entry(raiser.__code__, _C.CacheEntry(compiled_body, always_tree()))
    with callback(False):
        with pytest.raises(KeyError, match="from entry 5") as ei:
            raiser(5)
    tb = traceback.extract_tb(ei.value.__traceback__)
    assert tb[-1].name == "compiled_body"
    assert "raise KeyError" in tb[-1].line
    assert tb[-2].name == "test_exception_from_entry_propagates_with_entry_frames_in_traceback"


def test_exception_from_callback_propagates_and_hook_stays():
    def cb(view):
        if view.f_code is add.__code__:
            raise RuntimeError("callback failed")
        return None

    with callback(cb):
        with pytest.raises(RuntimeError, match="callback failed"):
            outer(1)
        assert _C.get_eval_frame() is cb
        with pytest.raises(RuntimeError, match="callback failed"):
            add(1, 2)
    assert _C._debug_hook_state()["active_threads"] == 0


def test_refcounts_unchanged_after_errors():
    a = object()
    _C.insert_entry(raiser.__code__, _C.CacheEntry(lambda x: 1 / 0, always_tree()))
    before = sys.getrefcount(a)
    with callback(False):
        for _ in range(1000):
            with pytest.raises(ZeroDivisionError):
                raiser(a)
    def cb(view):
        if view.f_code is add.__code__:
            raise OSError("cb")

    with callback(cb):
        for _ in range(1000):
            with pytest.raises(OSError):
                add(a, a)
    assert sys.getrefcount(a) == before


# -- keyboard interrupts -------------------------------------------------------------------------

@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler for the test: a process started in the background (a CI
    job launched with `&`) inherits SIGINT ignored, and Python then installs no handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def interrupted(x):
    signal.raise_signal(signal.SIGINT)
    return x  # the pending signal raises KeyboardInterrupt in this frame


def test_keyboard_interrupt_in_eager_intercepted_frame(sigint_raises):
    rec = Recorder()
    with callback(rec):
        with pytest.raises(KeyboardInterrupt):
            interrupted(1)
        assert _C.get_eval_frame() is rec
        assert add(1, 2) == 3  # still intercepted afterwards, callback frames still exempt
    assert rec.names() == ["interrupted", "add"]


def test_keyboard_interrupt_in_entry_and_in_callback(sigint_raises):
    def compiled(x):
        signal.raise_signal(signal.SIGINT)
        return x

    _C.insert_entry(interrupted.__code__, _C.CacheEntry(compiled, always_tree()))
    with callback(False):
        with pytest.raises(KeyboardInterrupt):
            interrupted(1)
    assert _C.get_eval_frame() is None

    calls = []

    def cb(view):
        if view.f_code.co_filename != __file__:
            return None
        calls.append(view.f_code.co_name)
        if len(calls) == 1:
            raise KeyboardInterrupt
        add(0, 0)  # must not be intercepted: the callback flag was restored correctly
        return None

    with callback(cb):
        with pytest.raises(KeyboardInterrupt):
            outer(1)
        assert outer(1) == 4
    assert calls == ["outer", "outer", "add"]


# -- threads -------------------------------------------------------------------------------------

def test_callback_is_per_thread_and_hook_follows_the_threads():
    main_rec = Recorder()
    worker_rec = Recorder()
    started, done = threading.Event(), threading.Event()
    states = {}

    def worker():
        _C.set_eval_frame(worker_rec)
        started.set()
        done.wait(10)
        add(1, 1)
        _C.set_eval_frame(None)
        states["after_worker_unset"] = _C._debug_hook_state()

    t = threading.Thread(target=worker)
    t.start()
    started.wait(10)
    states["worker_only"] = _C._debug_hook_state()
    add(5, 5)  # main thread has no callback: not intercepted
    assert _C.get_eval_frame() is None
    with callback(main_rec):
        add(2, 2)
        done.set()
        t.join(10)
        assert _C._debug_hook_state()["installed"]  # main still has one
    assert states["worker_only"]["installed"] and states["worker_only"]["active_threads"] == 1
    assert states["after_worker_unset"]["active_threads"] == 1  # main's
    assert [v.args for v in main_rec.views] == [(2, 2)]
    assert [v.args for v in worker_rec.views] == [(1, 1)]
    assert not _C._debug_hook_state()["installed"]


def test_thread_exiting_with_a_callback_gives_back_its_share():
    def worker():
        _C.set_eval_frame(Recorder())
        add(1, 2)

    for _ in range(3):
        t = threading.Thread(target=worker)
        t.start()
        t.join(10)
    st = _C._debug_hook_state()
    assert st["active_threads"] == 0 and not st["installed"]


def test_threads_hitting_the_same_cache():
    _C.insert_entry(add.__code__, _C.CacheEntry(lambda a, b: a * b, always_tree()))
    errors = []

    def worker():
        try:
            with callback(False):
                for i in range(2000):
                    assert add(i, 2) == 2 * i
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert errors == []
    assert _C.cache_stats()["hits"] == 8000


# -- reference counts and memory over many calls -------------------------------------------------

N = 100_000


def test_no_leaks_over_many_hits():
    class Arg:
        pass

    a, b = Arg(), Arg()

    def compiled(x, y, *rest, **kw):
        return x

    def f(x, y, *rest, **kw):
        return None

    entry = _C.CacheEntry(compiled, type_tree(0, "x", Arg))
    _C.insert_entry(f.__code__, entry)
    ra, rb = sys.getrefcount(a), sys.getrefcount(b)
    rf, re = sys.getrefcount(compiled), sys.getrefcount(entry)
    with callback(False):
        for _ in range(1000):
            f(a, b, a, k=b)
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        for _ in range(N):
            f(a, b, a, k=b)
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
    assert (sys.getrefcount(a), sys.getrefcount(b)) == (ra, rb)
    assert (sys.getrefcount(compiled), sys.getrefcount(entry)) == (rf, re)
    assert entry.hits == N + 1000
    grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename") if s.size_diff > 0)
    assert grown < 64 * 1024, grown


def test_no_leaks_over_many_misses_and_guard_failures():
    class Arg:
        pass

    a = Arg()
    cb = Recorder(lambda v: None)
    cb.views = None  # don't keep views

    def counting_cb(view, n=[0, 0]):
        n[0] += view.f_code is f.__code__
        n[1] += 1  # every call (frames of other code may reach it too)
        return None

    def f(x):
        return x

    _C.insert_entry(f.__code__, _C.CacheEntry(lambda x: "int", type_tree(0, "x", int)))
    ra, rc = sys.getrefcount(a), sys.getrefcount(counting_cb)
    with callback(counting_cb):
        for _ in range(N):
            assert f(a) is a
    assert sys.getrefcount(a) == ra and sys.getrefcount(counting_cb) == rc
    mine, every = counting_cb.__defaults__[0]
    assert mine == N
    assert _C.cache_stats()["guard_failures"] == N and _C.cache_stats()["misses"] == every


def test_deep_recursion_with_hits_pops_frames_correctly():
    """On 3.12 the hook pops replaced frames itself; frames that start a new data-stack chunk
    free that chunk. Recursing to many depths puts hit frames at chunk starts."""
    a = object()

    def leaf(x):
        return "eager"

    def rec(n):
        return leaf(a) if n == 0 else rec(n - 1) + leaf(a)

    _C.insert_entry(leaf.__code__, _C.CacheEntry(lambda x: "hit", always_tree()))
    ra = sys.getrefcount(a)
    before = _C._debug_hook_state()["chunk_pops"]
    with callback(False):
        for d in range(0, 400, 7):
            assert rec(d) == "hit" * (d + 1)
    assert sys.getrefcount(a) == ra
    if sys.version_info >= (3, 12):
        assert _C._debug_hook_state()["chunk_pops"] > before


def test_entry_function_released_with_entries():
    def compiled(x):
        return x

    r = weakref.ref(compiled)
    _C.insert_entry(add.__code__, _C.CacheEntry(compiled, always_tree()))
    del compiled
    gc.collect()
    assert r() is not None
    _C.reset()
    gc.collect()
    assert r() is None


# -- frames that are never replaced --------------------------------------------------------------

def test_class_bodies_and_exec_with_locals_run_unchanged():
    rec = Recorder(lambda v: _C.CacheEntry(lambda *a: "WRONG", always_tree()))
    ns = {}
    with callback(rec):
        class K:
            attr = 1

            def m(self):
                return self.attr
        exec("y = 2 + 3", {}, ns)
        code = compile("z = 7", "<t>", "exec")
        g = {}
        exec(code, g)
    assert K.attr == 1 and ns == {"y": 5} and g["z"] == 7
    assert rec.views == []


def test_recursion_error_through_hits_is_clean():
    a = object()

    def rec(n, obj):
        return 0 if n == 0 else 1 + rec(n - 1, obj)

    def compiled(n, obj, rec_cell):  # rec is a free variable of itself: its cell comes last
        return 0 if n == 0 else 1 + rec_cell.cell_contents(n - 1, obj)

    _C.insert_entry(rec.__code__, _C.CacheEntry(compiled, always_tree()))
    ra = sys.getrefcount(a)
    with callback(False):
        assert rec(50, a) == 50
        with pytest.raises(RecursionError):
            rec(100_000, a)
        assert rec(60, a) == 60
    assert sys.getrefcount(a) == ra
    assert _C.cache_entries(rec.__code__)[0].hits > 51 + 61 + 100


def test_bound_methods_pass_self_in_slot_zero():
    class Obj:
        def method(self, x):
            return ("eager", x)

    o = Obj()
    got = []
    _C.insert_entry(Obj.method.__code__, _C.CacheEntry(lambda s, x: got.append((s, x)) or "hit",
                                                       always_tree()))
    with callback(False):
        assert o.method(4) == "hit"
    assert got == [(o, 4)]


def test_tracing_and_profiling_alongside_the_hook():
    events = []

    def tracer(frame, event, arg):
        events.append((frame.f_code.co_name, event))
        return tracer

    _C.insert_entry(add.__code__, _C.CacheEntry(lambda a, b: ("hit", a, b), always_tree()))
    rec = Recorder()
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        with callback(rec):
            assert outer(2) == ("hit", 2, 1) * 2
            assert fact(4) == 24
    finally:
        sys.settrace(old)
    sys.setprofile(lambda *a: None)
    try:
        with callback(False):
            assert add(1, 2) == ("hit", 1, 2)
    finally:
        sys.setprofile(None)
    assert ("outer", "call") in events and ("fact", "return") in events
    assert ("add", "call") not in events  # replaced by its entry: never ran
    # The trace function is a Python frame too (called by the interpreter): intercepted.
    assert [n for n in rec.names() if n != "tracer"] == ["outer", "fact", "fact", "fact", "fact"]


def test_interpreter_exits_cleanly_with_callback_and_entries_alive(tmp_path):
    import os
    import subprocess
    script = tmp_path / "exit_with_hook.py"
    script.write_text(
        "import threading\n"
        "from ferrodyn import _C\n"
        "def f(x): return x\n"
        "def comp(x): return ('c', x)\n"
        "_C.insert_entry(f.__code__, _C.CacheEntry(comp, _C.GuardBuilder().build()))\n"
        "_C.set_eval_frame(lambda v: None)\n"
        "assert f(1) == ('c', 1)\n"
        "def w():\n"
        "    _C.set_eval_frame(False)\n"
        "    assert f(2) == ('c', 2)\n"
        "t = threading.Thread(target=w, daemon=True); t.start(); t.join()\n"
        "class D:\n"
        "    def __del__(self):\n"
        "        print('finalizer', f(3))\n"
        "d = D(); d.self = d\n"
        "print('done')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-X", "faulthandler", str(script)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "done"


def test_threads_compiling_the_same_code_concurrently():
    def poly(x):
        return ("eager", x)

    compiles = []

    def cb(view):
        if view.f_code is not poly.__code__:
            return None
        (x,) = view.args
        t = type(x)
        compiles.append(t)
        return _C.CacheEntry(lambda x: (t.__name__, x), type_tree(0, "x", t))

    values = [1, "s", 2.5, b"b", (1,)]
    errors = []

    def worker(k):
        try:
            with callback(cb):
                for i in range(500):
                    v = values[(i + k) % len(values)]
                    assert poly(v) == (type(v).__name__, v)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert errors == []
    entries = _C.cache_entries(poly.__code__)
    # Threads may race to compile the same type before either inserts; never past the limit.
    assert len(values) <= len(entries) <= _C.get_cache_size_limit()
    assert len(entries) == min(len(compiles), _C.get_cache_size_limit())
    # Every call was either a hit or a compile (which ran its new entry without a lookup).
    assert sum(e.hits for e in entries) + len(compiles) == 4 * 500


def test_callback_may_switch_callbacks_inside():
    seen = []

    def inner_cb(view):  # pragma: no cover - must never be called
        seen.append(("inner", view.f_code.co_name))

    def cb(view):
        if view.f_code.co_filename != __file__:
            return None
        seen.append(("outer", view.f_code.co_name))
        prev = _C.set_eval_frame(inner_cb)
        add(0, 0)  # still inside the callback: not intercepted by either
        assert _C.set_eval_frame(prev) is inner_cb
        return None

    with callback(cb):
        assert outer(1) == 4
    assert seen == [("outer", "outer"), ("outer", "add")]
    assert _C._debug_hook_state()["active_threads"] == 0


def test_exceptions_swallowed_by_failing_guards_are_freed_promptly():
    live = [0]

    class Boom(Exception):
        def __init__(self):
            live[0] += 1

        def __del__(self):
            live[0] -= 1

    class Weird:
        def __getattr__(self, name):
            raise Boom()

    def f(o):
        return "eager"

    b = _C.GuardBuilder()
    b.equals(b.attr(b.local(0, "o"), "flag"), True)
    raising_tree = b.build()
    _C.insert_entry(f.__code__, _C.CacheEntry(lambda o: "hit", raising_tree))
    w = Weird()
    counts = []
    with callback(False):
        for _ in range(200):
            assert f(w) == "eager"  # the guard raises inside: a failure, the frame runs
            counts.append(live[0])
    assert max(counts) == 0
    assert _C.cache_stats()["guard_failures"] == 200
    # The same when a later entry hits after the raising one failed.
    _C.reset()
    _C.insert_entry(f.__code__, _C.CacheEntry(lambda o: "hit", always_tree()))
    _C.insert_entry(f.__code__, _C.CacheEntry(lambda o: "never", raising_tree))
    with callback(False):
        assert f(w) == "hit"
        assert live[0] == 0

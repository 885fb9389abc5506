"""The per-code cache (rust/cache): entry order and move-to-front, the size limit and its
one-time warning, counters, reset, and entries dying with their code object. The hook that
consults it is tested in test_eval_frame.py."""

import gc
import warnings
import weakref

import pytest

from ferrodyn import _C
from hook_helpers import Recorder, always_tree, callback, type_tree


pytestmark = pytest.mark.usefixtures("clean_hook_cache")


def f(x):
    return ("eager", x)


def entry(tag, tree=None, **kw):
    return _C.CacheEntry(lambda x: (tag, x), tree if tree is not None else always_tree(), **kw)


def test_cache_entry_properties():
    fn = lambda x: x  # noqa: E731
    tree = type_tree(0, "x", int)
    e = _C.CacheEntry(fn, tree, backend_id=7, compile_id="0/1")
    assert e.fn is fn and e.guards is tree
    assert e.backend_id == 7 and e.compile_id == "0/1" and e.hits == 0
    d = _C.CacheEntry(fn, tree)
    assert d.backend_id == 0 and d.compile_id == ""
    with pytest.raises(TypeError):
        _C.CacheEntry(1, tree)
    with pytest.raises(TypeError):
        _C.CacheEntry(fn, "not a tree")


def test_insert_puts_entries_at_the_front():
    a, b = entry("a"), entry("b")
    _C.insert_entry(f.__code__, a)
    _C.insert_entry(f.__code__, b)
    assert _C.cache_entries(f.__code__) == [b, a]
    assert _C.cache_stats()["entries"] == 2
    with callback(False):
        assert f(1) == ("b", 1)  # front entry passes first
    assert (b.hits, a.hits) == (1, 0)


def test_first_passing_entry_wins_and_moves_to_front():
    e_int, e_str, e_float = (entry(t.__name__, type_tree(0, "x", t)) for t in (int, str, float))
    for e in (e_int, e_str, e_float):
        _C.insert_entry(f.__code__, e)
    assert _C.cache_entries(f.__code__) == [e_float, e_str, e_int]
    with callback(False):
        assert f(3) == ("int", 3)
        assert _C.cache_entries(f.__code__) == [e_int, e_float, e_str]
        assert _C.cache_stats()["guard_failures"] == 2
        assert f("s") == ("str", "s")
        assert _C.cache_entries(f.__code__) == [e_str, e_int, e_float]
        assert f(4) == ("int", 4)
        assert _C.cache_entries(f.__code__) == [e_int, e_str, e_float]
        assert f(b"bytes") == ("eager", b"bytes")  # no entry passes: runs normally
    st = _C.cache_stats()
    assert st["hits"] == 3 and st["guard_failures"] == 2 + 2 + 1 + 3 and st["misses"] == 0
    assert (e_int.hits, e_str.hits, e_float.hits) == (2, 1, 0)


def test_callback_compiles_per_type_and_hits_afterwards():
    # Frames of other code (on 3.12, an audit hook that importing torch's backends installs)
    # may reach the callback too: count every call, and f's separately.
    calls, compiled = [], []

    def cb(view):
        calls.append(view.f_code)
        if view.f_code is not f.__code__:
            return None
        (x,) = view.args
        compiled.append(x)
        return entry(f"compiled-{type(x).__name__}", type_tree(0, "x", type(x)))

    with callback(cb):
        assert f(1) == ("compiled-int", 1)
        assert f("a") == ("compiled-str", "a")
        assert f(2) == ("compiled-int", 2)
        assert f("b") == ("compiled-str", "b")
    assert compiled == [1, "a"]  # f missed once per type, then hit
    st = _C.cache_stats()
    assert st["misses"] == len(calls)  # the counter counts exactly the callback calls
    assert st["hits"] == 2 and st["entries"] == 2
    assert sorted(e.hits for e in _C.cache_entries(f.__code__)) == [1, 1]


def test_limit_runs_eagerly_and_warns_once():
    _C.set_cache_size_limit(2)
    assert _C.get_cache_size_limit() == 2

    compiles = []

    def cb(view):
        if view.f_code is not f.__code__:
            return None
        (x,) = view.args
        compiles.append(x)
        return entry("compiled", type_tree(0, "x", type(x)))

    with callback(cb):
        assert f(1) == ("compiled", 1)
        assert f("s") == ("compiled", "s")
        with pytest.warns(RuntimeWarning) as rec:
            assert f(1.5) == ("eager", 1.5)
        msg = str(rec[0].message)
        assert "'f'" in msg and __file__ in msg
        assert f":{f.__code__.co_firstlineno}" in msg and "(2 entries)" in msg
        # Names the setting users of ferrodyn.compile change, not the low-level function.
        assert "ferrodyn.config.cache_size_limit" in msg and "set_cache_size_limit" not in msg
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert f(2.5) == ("eager", 2.5)  # no second warning
            assert f(3) == ("compiled", 3)  # existing entries still hit
    st = _C.cache_stats()
    assert st["limit_reached"] == 2 and st["entries"] == 2
    assert compiles == [1, "s"]  # never called for f at the limit


def test_insert_entry_respects_the_limit():
    _C.set_cache_size_limit(1)
    a, b = entry("a"), entry("b")
    _C.insert_entry(f.__code__, a)
    with pytest.warns(RuntimeWarning, match="cache size limit"):
        _C.insert_entry(f.__code__, b)
    assert _C.cache_entries(f.__code__) == [a]
    assert _C.cache_stats()["limit_reached"] == 1


def test_limit_warning_as_error_propagates_from_the_call():
    _C.set_cache_size_limit(1)
    _C.insert_entry(f.__code__, entry("str", type_tree(0, "x", str)))
    rec = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with callback(rec):
            with pytest.raises(RuntimeWarning, match="cache size limit"):
                f(1)
            assert f(2) == ("eager", 2)  # warned once: later frames simply run
            assert f("s") == ("str", "s")
    assert [v for v in rec.views if v.f_code is f.__code__] == []


def test_set_cache_size_limit_rejects_negative():
    with pytest.raises(ValueError):
        _C.set_cache_size_limit(-1)


def test_reset_clears_entries_flags_counters_and_warnings():
    def g(x):
        return x

    fn = lambda x: "cached"  # noqa: E731
    r = weakref.ref(fn)
    _C.insert_entry(f.__code__, _C.CacheEntry(fn, always_tree()))
    _C.skip_code(g.__code__)
    with callback(False):
        f(1)
    _C.set_cache_size_limit(1)
    with pytest.warns(RuntimeWarning):
        _C.insert_entry(f.__code__, entry("x"))
    del fn
    assert _C.cache_stats() == {"hits": 1, "misses": 0, "guard_failures": 0, "limit_reached": 1, "entries": 1}
    _C.reset()
    gc.collect()
    assert r() is None
    assert _C.cache_entries(f.__code__) == []
    assert _C.code_flags(g.__code__) == "default"
    assert _C.cache_stats() == {"hits": 0, "misses": 0, "guard_failures": 0, "limit_reached": 0, "entries": 0}
    _C.insert_entry(f.__code__, entry("y"))
    with pytest.warns(RuntimeWarning):  # the one-time warning is re-armed by reset
        _C.insert_entry(f.__code__, entry("z"))


def test_entries_die_with_their_code_object():
    ns = {}
    exec("def victim(x):\n    return x\n", ns)
    victim = ns.pop("victim")
    fn = lambda x: "cached"  # noqa: E731
    r_fn = weakref.ref(fn)
    r_code = weakref.ref(victim.__code__)
    _C.insert_entry(victim.__code__, _C.CacheEntry(fn, always_tree()))
    del fn
    assert _C.cache_stats()["entries"] == 1
    with callback(False):
        assert victim(1) == "cached"
    del victim
    gc.collect()
    assert r_code() is None
    assert r_fn() is None
    assert _C.cache_stats()["entries"] == 0
    _C.reset()  # the dead code is no longer registered: nothing to visit


def test_entry_function_code_is_marked_skip():
    def compiled(x):
        return ("compiled", x)

    _C.insert_entry(f.__code__, _C.CacheEntry(compiled, always_tree()))
    assert _C.code_flags(compiled.__code__) == "skip"
    assert _C.code_flags(f.__code__) == "default"


def test_cache_functions_reject_non_code():
    with pytest.raises(TypeError):
        _C.cache_entries(f)
    with pytest.raises(TypeError):
        _C.insert_entry(f, entry("a"))


def test_limit_zero_never_calls_the_callback():
    ns = {}
    exec("def fresh(x):\n    return ('eager', x)\n", ns)
    fresh = ns["fresh"]
    _C.set_cache_size_limit(0)
    calls = []

    def cb(view):
        if view.f_code is fresh.__code__:
            calls.append(view)
            return entry("compiled")
        return None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with callback(cb):
            assert fresh(1) == ("eager", 1)
            assert fresh(2) == ("eager", 2)
    mine = [str(w.message) for w in caught if "'fresh'" in str(w.message)]
    assert len(mine) == 1 and "(0 entries)" in mine[0]  # once per code object
    assert calls == [] and _C.cache_entries(fresh.__code__) == []
    assert _C.cache_stats()["limit_reached"] >= 2  # fresh twice (and any other frame)

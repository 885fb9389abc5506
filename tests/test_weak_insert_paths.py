"""ferrodyn.weak (rust/weak/core.rs `Core::insert`, rust/ffi/mapslot.rs): the paths of inserting
a new key and of `d[k] = v` / `del d[k]`, checked against torch.utils.weak where both can run.

- `d[k] = v` and `del d[k]` on the native classes go through a direct `mp_ass_subscript` slot
  (no pyo3 trampoline); Python subclasses go through `__setitem__`/`__delitem__`. Both must
  behave alike, release replaced and deleted values at once (no deferred release), and raise
  the same errors.
- A new key's insert looks the key up, makes its weakref with the table unlocked (which can run
  the garbage collector, hence any code), then inserts with one more probe: code run meanwhile
  that inserts the same key must be seen (`d[k] = v` overwrites it, `setdefault` keeps it).
- A key's weakref may come from `_WeakKeyRef`'s free list (instances of dead keys' weakrefs):
  it must be a fresh weakref of the new key; the list is bounded.
- Keys dying right after their insert, re-inserted after death, dictionaries dying before their
  keys, many keys (table growth), all with the table's invariants checked.
"""

import gc
import sys
import weakref

import pytest
import torch
import torch.utils.weak as tweak

import ferrodyn.weak as fweak
from ferrodyn import _C


class Key:
    def __init__(self, tag=0):
        self.tag = tag


class OnDel:
    """A value that appends `tag` to `log` when it is released."""

    def __init__(self, log, tag):
        self.log, self.tag = log, tag

    def __del__(self):
        self.log.append(self.tag)


class PySub(fweak.WeakIdKeyDictionary):
    """A Python subclass: its `d[k] = v` runs pyo3's `__setitem__`, not the direct slot."""


class PyExactSub(fweak.WeakKeyExactDictionary):
    pass


FERRODYN = {
    "native": fweak.WeakIdKeyDictionary,
    "native-exact": fweak.WeakKeyExactDictionary,
    "python-subclass": PySub,
    "python-subclass-exact": PyExactSub,
}
ALL = {**FERRODYN, "torch": tweak.WeakIdKeyDictionary}


def check(d):
    if not isinstance(d, tweak.WeakIdKeyDictionary):
        _C._debug_weak_check(d)


@pytest.fixture(params=sorted(ALL))
def WeakDict(request):
    return ALL[request.param]


@pytest.fixture(params=sorted(FERRODYN))
def FDict(request):
    return FERRODYN[request.param]


def test_native_classes_carry_the_direct_slot_and_python_subclasses_inherit_behaviour():
    assert _C._debug_weak_direct_setitem(fweak.WeakIdKeyDictionary)
    # the native subclass is created after the slot is installed, so it copies it
    assert _C._debug_weak_direct_setitem(fweak.WeakKeyExactDictionary)
    # a Python subclass takes pyo3's slot from the __setitem__ descriptor: same behaviour
    assert not _C._debug_weak_direct_setitem(PySub)


def test_overwrite_and_delete_release_values_at_once(WeakDict):
    log = []
    d = WeakDict()
    k = Key()
    d[k] = OnDel(log, "a")
    d[k] = OnDel(log, "b")
    assert log == ["a"]
    del d[k]
    assert log == ["a", "b"]
    d[k] = OnDel(log, "c")
    del k  # the key dies: its value goes with it
    assert log == ["a", "b", "c"]
    assert len(d) == 0


def test_reference_counts_through_the_slot(FDict):
    d = FDict()
    k, v = Key(), Key()
    base_k, base_v = sys.getrefcount(k), sys.getrefcount(v)
    for _ in range(3):
        d[k] = v
    assert (sys.getrefcount(k), sys.getrefcount(v)) == (base_k, base_v + 1)
    del d[k]
    assert (sys.getrefcount(k), sys.getrefcount(v)) == (base_k, base_v)
    with pytest.raises(KeyError):
        del d[k]
    assert (sys.getrefcount(k), sys.getrefcount(v)) == (base_k, base_v)


@pytest.mark.parametrize("key", [13, "s", (1, 2), None])
def test_errors_of_the_slot_match_torch(key):
    for cls in (tweak.WeakIdKeyDictionary, fweak.WeakIdKeyDictionary, PySub):
        d = cls()
        with pytest.raises(TypeError, match="cannot create weak reference"):
            d[key] = 1
        with pytest.raises(TypeError, match="cannot create weak reference"):
            del d[key]
        assert len(d) == 0
    for cls in (fweak.WeakKeyExactDictionary, PyExactSub):
        d = cls()
        with pytest.raises(TypeError, match="cannot create weak reference"):
            d[key] = 1
        with pytest.raises(KeyError):  # lookups of such keys miss in the exact dictionary
            del d[key]


def test_missing_key_error_names_the_key(FDict):
    # (torch's names the WeakIdRef it made for the lookup)
    d = FDict()
    k = Key()
    with pytest.raises(KeyError) as e:
        del d[k]
    assert e.value.args == (k,)


@pytest.fixture
def gc_on_every_allocation():
    """Collect on every GC-tracked allocation (a new key's weakref is one), restoring after."""
    was = gc.isenabled()
    old = gc.get_threshold()
    gc.enable()
    gc.set_threshold(1)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        if not was:
            gc.disable()


def drain_free_list():
    """Take every `_WeakKeyRef` off the free list (a reused one is not a new allocation, and
    starts no collection), by inserting as many keys; hold what is returned meanwhile."""
    n, _ = _C._debug_weak_free_list()
    keys = [Key() for _ in range(n)]
    d = fweak.WeakIdKeyDictionary({k: None for k in keys})
    assert _C._debug_weak_free_list()[0] == 0
    return d, keys


def run_with_a_collection_inside(make):
    """`make()` -> (insert, action): call `insert()` with `action()` run by a garbage collection
    inside it (the first one once it started), and return what `insert` returned. At threshold
    1, a collection runs at the allocation that brings the count of new GC-tracked objects to 2;
    a full collection leaves the count at 0 or 1 and one more allocation may follow, so one of
    two consecutive attempts collects at the insert's first GC-tracked allocation (the key's
    weakref, for ferrodyn). An attempt where no collection ran inside is made again with fresh
    state from `make`."""
    for attempt in range(6):
        insert, action = make()
        held = drain_free_list()  # noqa: F841  (so the insert allocates its weakref)
        armed, fired = [], []

        def cb(phase, info):
            if phase == "start" and armed and not fired:
                fired.append(True)
                action()

        gc.callbacks.append(cb)
        try:
            gc.collect()
            pad = [] if attempt % 2 else None  # noqa: F841  (one allocation or none)
            armed.append(True)  # (no GC-tracked allocation)
            result = insert()
        finally:
            gc.callbacks.remove(cb)
        if fired:
            return result
    pytest.fail("no garbage collection ran inside the insert")


# On 3.11 a collection runs at the allocation that starts it: inside the insert, at its
# weakref (ferrodyn) or its bound `_remove` (torch), before the key is stored. From 3.12 it runs
# at the interpreter's next check for pending work, which may fall before or after the insert
# (never inside ferrodyn's, which runs no bytecode): the tests then check the outcome of
# whichever order they observed.
COLLECTS_AT_ALLOCATION = sys.version_info < (3, 12)


def test_key_inserted_while_its_weakref_is_made_is_overwritten(WeakDict, gc_on_every_allocation):
    state = {}

    def make():
        d, k = WeakDict(), Key()
        state.update(d=d, k=k)

        def insert():
            d[k] = "outer"

        def action():
            state["stored_first"] = k in d
            d[k] = "from gc"

        return insert, action

    run_with_a_collection_inside(make)
    d, k = state["d"], state.pop("k")
    if COLLECTS_AT_ALLOCATION:
        assert not state["stored_first"]
    assert len(d) == 1 and d[k] == ("from gc" if state["stored_first"] else "outer")
    check(d)
    del k
    assert len(d) == 0
    check(d)


def test_setdefault_keeps_a_value_inserted_while_its_weakref_is_made(WeakDict,
                                                                    gc_on_every_allocation):
    state = {}

    def make():
        d, k = WeakDict(), Key()
        state.update(d=d, k=k)

        def action():
            state["stored_first"] = k in d
            d[k] = "from gc"

        return (lambda: d.setdefault(k, "outer")), action

    got = run_with_a_collection_inside(make)
    d, k = state["d"], state["k"]
    if COLLECTS_AT_ALLOCATION:
        assert not state["stored_first"]
    assert got == ("outer" if state["stored_first"] else "from gc")
    assert d[k] == "from gc" and len(d) == 1
    check(d)


def test_other_keys_inserted_and_killed_while_a_weakref_is_made(WeakDict, gc_on_every_allocation):
    state = {}

    def make():
        d = WeakDict()
        others = [Key(i) for i in range(5)]
        for o in others:
            d[o] = o.tag
        k, extra = Key(99), Key(100)
        state.update(d=d, k=k, extra=extra, others=others)

        def insert():
            d[k] = "k"

        def action():
            d[extra] = "extra"
            others.pop()  # a key dies: its entry goes

        return insert, action

    run_with_a_collection_inside(make)
    d = state["d"]
    assert sorted(x.tag for x in d) == [0, 1, 2, 3, 99, 100]
    assert d[state["k"]] == "k" and d[state["extra"]] == "extra"
    check(d)


def test_key_dying_right_after_insert_then_reinserted(WeakDict):
    d = WeakDict()
    for i in range(200):
        k = Key(i)
        d[k] = i
        del k  # dies at once
        assert len(d) == 0
    keep = [Key(i) for i in range(50)]
    for round_ in range(3):
        for k in keep:
            d[k] = round_
        assert len(d) == 50 and all(d[k] == round_ for k in keep)
        check(d)
        dead = keep[::2]
        keep = keep[1::2] + [Key(1000 + j) for j in range(len(dead))]
        del dead
        check(d)
    assert len(d) == 25


def test_many_keys_growth_then_all_die(WeakDict):
    d = WeakDict()
    keys = [torch.randn(1) for _ in range(5000)]
    for i, k in enumerate(keys):
        d[k] = i
    del k
    assert len(d) == 5000
    assert all(d[keys[i]] == i for i in range(0, 5000, 97))
    check(d)
    del keys[::2]
    assert len(d) == 2500
    check(d)
    for k in keys:
        d[k] = -1
    del k
    assert set(d.values()) == {-1}
    keys.clear()
    assert len(d) == 0
    check(d)


def test_dictionary_dying_before_its_keys_after_inserts(FDict):
    keys = [Key(i) for i in range(100)]
    d = FDict()
    for k in keys:
        d[k] = Key()
    del k
    refs = d.keyrefs()
    del d
    gc.collect()
    # the keys live on and their weakrefs still answer; their deaths later change nothing
    assert all(r() is k for r, k in zip(refs, keys))
    del keys
    assert all(r() is None for r in refs)


def test_keys_dying_in_a_collected_cycle(WeakDict):
    d = WeakDict()
    survivors = [Key(i) for i in range(10)]
    for k in survivors:
        d[k] = k.tag
    for i in range(20):
        a, b = Key(100 + i), Key(200 + i)
        a.other, b.other = b, a  # a cycle only the collector frees
        d[a] = OnDel([], "a")
        d[b] = i
    del a, b
    gc.collect()
    assert sorted(k.tag for k in d) == list(range(10))
    check(d)
    # the dictionary keeps working after the collection
    late = Key(999)
    d[late] = "late"
    assert d[late] == "late" and len(d) == 11
    check(d)


def test_cycles_through_key_weakrefs_and_their_callback_are_collected(FDict):
    # the collector is not shown the keys' weakrefs (from the table) nor what they hold (their
    # callback): cycles through them must still go, with the dictionary
    class Holder:
        pass

    k = Key()
    d = FDict()
    v = Holder()
    d[k] = v
    v.refs = d.keyrefs()  # value -> the key's weakref -> its callback
    v.callback = v.refs[0].__callback__
    v.d = d  # value -> dictionary: a cycle only the collector frees
    probe_d, probe_v = weakref.ref(d), weakref.ref(v)
    del d, v
    gc.collect()
    assert probe_d() is None and probe_v() is None
    # the key outlives its dictionary; its death later changes nothing
    del k
    gc.collect()


def test_value_holding_the_callback_is_released_with_the_dictionary(FDict):
    class Holder:
        pass

    k = Key()
    d = FDict()
    h = Holder()
    d[k] = h
    h.callback = d.keyrefs()[0].__callback__
    probe = weakref.ref(h)
    del h, d  # released by reference counts alone (the dictionary empties its table)
    assert probe() is None


def test_weakrefs_reused_from_the_free_list_are_fresh():
    n, cap = _C._debug_weak_free_list()
    d = fweak.WeakIdKeyDictionary()
    first = [Key(i) for i in range(300)]
    for k in first:
        d[k] = k.tag
    del k
    first_refs = set(map(id, d.keyrefs()))
    del first  # their entries go, their weakrefs onto the free list
    assert len(d) == 0
    assert _C._debug_weak_free_list()[0] >= min(cap, 300)
    second = [Key(1000 + i) for i in range(300)]
    for k in second:
        d[k] = k.tag
    del k
    refs = d.keyrefs()
    assert set(map(id, refs)) & first_refs  # reused memory...
    for r, k in zip(refs, second):  # ...as fresh weakrefs of the new keys
        assert r() is k and r == weakref.ref(k) and hash(r) == hash(k)
        assert r.__callback__ is refs[0].__callback__
        assert gc.is_tracked(r)
        assert _C._debug_weak_keyref_slot(r) is not None
    check(d)
    assert sorted(d.values()) == [k.tag for k in second]
    del refs, r, k
    second.reverse()
    while second:
        second.pop()
        if len(second) % 50 == 0:
            assert len(d) == len(second)
            check(d)
    assert len(d) == 0


def test_free_list_is_bounded():
    _, cap = _C._debug_weak_free_list()
    keys = [Key() for _ in range(cap + 100)]
    d = fweak.WeakIdKeyDictionary({k: 0 for k in keys})
    del keys
    assert len(d) == 0
    assert _C._debug_weak_free_list()[0] == cap


def test_keys_with_and_without_weakrefs_of_their_own(WeakDict):
    # a new key with no weakref pointing to it skips the first lookup; keys that have weakrefs
    # (the user's, another dictionary's, their own entry's) and type objects (whose weakref
    # lists 3.12+ keep elsewhere for builtin types) take it
    class Local:
        pass

    other = WeakDict()
    fresh, watched, shared = Key(1), Key(2), Key(3)
    watcher = weakref.ref(watched)
    other[shared] = "other"
    d = WeakDict()
    for key in (fresh, watched, shared, int, Local, Key):
        d[key] = "first"
        d[key] = "second"
        assert d.setdefault(key, "third") == "second"
    assert len(d) == 6 and set(d.values()) == {"second"}
    assert other[shared] == "other" and len(other) == 1
    del key, fresh, watched, shared, Local
    gc.collect()
    assert len(d) == 2 and watcher() is None and len(other) == 0
    check(d)

"""ferrodyn.weak's key weakrefs (rust/ffi/weakkey.rs): each key's weakref is a `_WeakKeyRef`, a
`weakref.ref` subclass carrying its entry's slot, so a key's death removes the entry without a
hash probe. These tests check the layout of that subclass, that it behaves as a weakref, and that
the slots it carries stay right through everything that moves or removes entries (deaths during
iteration, compaction, explicit removals then deaths, address reuse, copies, a dictionary dying
first, threads). Behaviour is compared with torch.utils.weak on the same operations where both
have it; `_C._debug_weak_check` checks the table's invariants and every entry's recorded slot.
"""

import functools
import gc
import random
import weakref

import pytest
import torch
import torch.utils.weak as tweak

import ferrodyn.weak as fweak
from thread_helpers import run_interleaved
from ferrodyn import _C

IMPLS = {"torch": tweak.WeakIdKeyDictionary, "ferrodyn": fweak.WeakIdKeyDictionary}


class Obj:
    def __init__(self, tag=0):
        self.tag = tag


def check(d):
    """Table invariants and slots, for ferrodyn's dictionaries (torch's have none to check)."""
    if isinstance(d, fweak.WeakIdKeyDictionary):
        _C._debug_weak_check(d)


# ---------------------------------------------------------------------------------------------
# the weakref subclass itself
# ---------------------------------------------------------------------------------------------


def test_layout_is_weakref_plus_one_word():
    base, offset, size = _C._debug_weak_keyref_layout()
    assert base == weakref.ref.__basicsize__
    assert offset >= base and offset % 8 == 0
    assert size == offset + 8 == _C._WeakKeyRef.__basicsize__
    assert _C._WeakKeyRef.__mro__[1] is weakref.ref


def test_key_weakrefs_behave_as_weakrefs():
    k, other = Obj(), Obj()
    d = fweak.WeakIdKeyDictionary({k: 1, other: 2})
    r, r2 = d.keyrefs()
    plain = weakref.ref(k)
    assert type(r) is _C._WeakKeyRef and isinstance(r, weakref.ref)
    assert r() is k and r2() is other
    assert hash(r) == hash(plain) == hash(k)
    assert r == plain and r != r2
    assert callable(r.__callback__)
    assert _C._debug_weak_keyref_slot(r) == 0 and _C._debug_weak_keyref_slot(r2) == 1
    assert _C._debug_weak_keyref_slot(plain) is None
    del k
    assert r() is None and len(d) == 1
    assert repr(r).startswith("<weakref at") and "dead" in repr(r)


def test_key_weakrefs_cannot_be_made_from_python():
    with pytest.raises(TypeError):
        _C._WeakKeyRef(Obj())
    with pytest.raises(TypeError):
        type("Sub", (_C._WeakKeyRef,), {})


def test_callback_called_by_hand_changes_nothing():
    # the callback is reachable as r.__callback__: calling it with a live key's weakref, a plain
    # weakref or another dictionary's weakref must not remove anything
    a, b = Obj(), Obj()
    d = fweak.WeakIdKeyDictionary({a: 1})
    e = fweak.WeakIdKeyDictionary({b: 2})
    (r,) = d.keyrefs()
    (re,) = e.keyrefs()
    cb = r.__callback__
    for arg in (r, weakref.ref(a), re, 3, None):
        cb(arg)
    assert (len(d), d[a], len(e), e[b]) == (1, 1, 1, 2)
    check(d)
    check(e)


# ---------------------------------------------------------------------------------------------
# slots stay right
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_deaths_in_random_order_then_reinserts(impl):
    d = IMPLS[impl]()
    keys = [Obj(i) for i in range(300)]
    for k in keys:
        d[k] = k.tag
    del k
    rnd = random.Random(5)
    rnd.shuffle(keys)
    for i in range(1, 280):
        keys.pop()  # dies; compaction moves the others (ferrodyn)
        if i % 37 == 0:
            check(d)
            fresh = Obj(-1)
            d[fresh] = -1
            keys.insert(0, fresh)
            del fresh
    assert len(keys) == 300 - 279 + 279 // 37
    assert len(d) == len(keys)
    assert sorted(d[k] for k in keys) == sorted(k.tag for k in keys)
    check(d)
    keys.clear()
    assert len(d) == 0
    check(d)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_key_dying_during_iteration_then_compaction(impl):
    d = IMPLS[impl]()
    keys = [Obj(i) for i in range(100)]
    for k in keys:
        d[k] = k.tag
    del k
    seen = []
    for k in d.keys():
        seen.append(k.tag)
        if len(seen) == 5:
            del keys[10:90]  # 80 keys die while slots must stay put
            check(d)
        del k
    assert seen == list(range(10)) + list(range(90, 100))
    assert len(d) == 20
    d[Obj()] = 0  # the next locked section may compact now; the new key dies at once
    check(d)
    del keys[:5]  # deaths after compaction find their moved entries
    assert sorted(d.values()) == list(range(5, 10)) + list(range(90, 100))
    check(d)


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("removal", ["pop", "del", "clear", "popitem"])
def test_explicit_removal_then_death_with_the_weakref_kept(impl, removal):
    # keyrefs() keeps the weakrefs alive past their entries: their callbacks still run at the
    # keys' deaths, and must not remove whatever entry took their old slot
    d = IMPLS[impl]()
    keys = [Obj(i) for i in range(40)]
    for k in keys:
        d[k] = k.tag
    del k
    refs = d.keyrefs()
    last = keys[-1]
    {"pop": lambda: d.pop(last), "del": lambda: d.__delitem__(last),
     "clear": d.clear, "popitem": d.popitem}[removal]()
    del last
    gone = 40 if removal == "clear" else 1
    for i in range(50):  # new entries reuse the freed slots
        o = Obj(100 + i)
        d[o] = o.tag
        keys.append(o)
    del o
    check(d)
    del keys[:40]  # the old keys die (their weakrefs are alive in refs)
    assert len(d) == 50 + (40 - gone) - (40 - gone)
    assert sorted(d.values()) == list(range(100, 150))
    check(d)
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_same_address_reinserted_after_death(impl):
    d = IMPLS[impl]()
    anchor = [Obj(i) for i in range(10)]
    for a in anchor:
        d[a] = a.tag
    addrs = set()
    for i in range(500):
        o = Obj(1000 + i)
        addrs.add(id(o))
        d[o] = i
        assert d[o] == i and len(d) == 11
        del o
        assert len(d) == 10
    assert len(addrs) < 500, "addresses were reused"
    assert sorted(d.values()) == list(range(10))
    check(d)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_copies_have_their_own_slots(impl):
    keys = [Obj(i) for i in range(60)]
    d = IMPLS[impl]({k: k.tag for k in keys})
    del keys[:30]  # d compacts; the copy is made from what is left
    c = d.copy()
    c2 = d | {}
    for k in keys[::2]:
        del c[k]
    check(d)
    check(c)
    del keys[::3]  # deaths reach the entries of all three dictionaries
    assert len(d) == len(keys) and len(c2) == len(keys)
    assert len(c) == sum(1 for k in keys if k.tag % 2)
    for x in (d, c, c2):
        check(x)
        assert all(x[k] == k.tag for k in keys if k in x)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_dictionary_dying_before_its_keys(impl):
    keys = [Obj(i) for i in range(50)]
    vals = [Obj() for _ in range(50)]
    probes = [weakref.ref(v) for v in vals]
    d = IMPLS[impl](zip(keys, vals))
    refs = d.keyrefs()
    del vals
    dref = weakref.ref(d)
    del d
    gc.collect()
    assert dref() is None
    assert all(p() is None for p in probes), "values are released with the dictionary"
    keys.clear()  # callbacks of the surviving weakrefs find no dictionary
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_dictionary_released_by_refcount_alone_releases_its_values(impl):
    # ferrodyn's table is also held by the weakrefs' callback (so a death needs no upgrade): the
    # dictionary going must still release every value at once, without the collector
    keys = [Obj(i) for i in range(40)]
    vals = [Obj() for _ in range(40)]
    probes = [weakref.ref(v) for v in vals]
    was = gc.isenabled()
    gc.disable()
    try:
        d = IMPLS[impl](zip(keys, vals))
        del vals
        del d
        assert all(p() is None for p in probes)
        keys.clear()
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_iterator_outliving_its_dictionary_keeps_the_entries(impl):
    keys = [Obj(i) for i in range(30)]
    vals = [Obj(i) for i in range(30)]
    probes = [weakref.ref(v) for v in vals]
    d = IMPLS[impl](zip(keys, vals))
    it = iter(d.items())
    first = next(it)
    del vals, d
    gc.collect()
    assert all(p() is not None for p in probes), "the iterator holds the entries"
    del keys[20:]  # keys dying while only the iterator holds the entries
    got = [first] + list(it)
    assert [(k.tag, v.tag) for k, v in got] == [(i, i) for i in range(20)]
    del got, first, it
    gc.collect()
    assert all(p() is None for p in probes)


def test_threads_inserting_and_killing_keys_in_one_dictionary():
    d = fweak.WeakIdKeyDictionary()
    errors = []

    def snapshot_keys():
        # Other threads insert and kill keys meanwhile: as with a dict (and torch.utils.weak's
        # dictionaries), an iteration that sees the size change raises and is simply retried.
        while True:
            try:
                return list(d.keys())
            except RuntimeError as e:
                if "changed size during iteration" not in str(e):
                    raise

    def worker(seed):
        rnd = random.Random(seed)
        mine = []
        try:
            for i in range(3000):
                if mine and rnd.random() < 0.45:
                    mine.pop(rnd.randrange(len(mine)))  # dies
                else:
                    k = Obj(i)
                    d[k] = (seed, i)
                    mine.append(k)
                if i % 500 == 0:
                    for k in snapshot_keys():
                        assert k in d
            for k in mine:
                assert d[k][0] == seed
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        mine.clear()

    run_interleaved(functools.partial(worker, s) for s in range(4))
    assert errors == []
    assert len(d) == 0
    check(d)


def test_table_shape_after_everything_died():
    keys = [torch.randn(1) for _ in range(1000)]
    d = fweak.WeakIdKeyDictionary({k: 0 for k in keys})
    del keys[::2]
    check(d)
    keys.clear()
    shape = _C._debug_weak_table(d)
    assert shape["len"] == 0 and shape["slots"] == 0 and shape["pending"] == 0
    assert shape["index"] <= 16, shape

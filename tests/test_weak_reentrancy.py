"""ferrodyn.weak (rust/weak): dropping values and killing keys re-enters the dictionary safely.

A value's `__del__`, or the death of a key it held, runs while the dictionary is inside
`__setitem__`, `__delitem__`, `pop`, `popitem`, `clear`, `update`, iteration or its own weakref
callbacks. Each scenario runs against torch.utils.weak's class and ferrodyn's: the end state must
be the same, and nothing may be reported as an unraisable exception (an error inside a weakref
callback or `__del__`, e.g. "Already borrowed"), crash or hang.
"""

import functools
import gc
import sys
import weakref

import pytest
import torch.utils.weak as tweak

import ferrodyn.weak as fweak
from thread_helpers import run_interleaved

IMPLS = {
    "torch": tweak.WeakIdKeyDictionary,
    "ferrodyn": fweak.WeakIdKeyDictionary,
    "ferrodyn-exact": fweak.WeakKeyExactDictionary,
}


@pytest.fixture(params=sorted(IMPLS))
def WeakDict(request):
    return IMPLS[request.param]


@pytest.fixture(autouse=True)
def no_unraisable():
    """Fail the test if an exception escaped into a weakref callback or a `__del__`."""
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(f"{u.exc_type.__name__}: {u.exc_value} ({u.object!r})")
    try:
        yield
    finally:
        sys.unraisablehook = old
    assert seen == []


class Key:
    def __init__(self, tag):
        self.tag = tag

    def __repr__(self):
        return f"Key({self.tag})"


class OnDel:
    """A value that runs `action()` when it is dropped."""

    def __init__(self, action):
        self.action = action

    def __del__(self):
        self.action()


def tags(d):
    return sorted(k.tag for k in d)


def test_overwrite_drops_old_value_that_deletes_other_keys(WeakDict):
    keys = [Key(i) for i in range(6)]
    d = WeakDict()
    d[keys[0]] = OnDel(lambda: [d.__delitem__(k) for k in keys[1:3]])
    for k in keys[1:]:
        d[k] = k.tag
    d[keys[0]] = "new"  # the old value's __del__ runs here
    assert tags(d) == [0, 3, 4, 5] and d[keys[0]] == "new"
    assert len(d) == 4


def test_overwrite_drops_old_value_that_inserts_and_overwrites(WeakDict):
    keys = [Key(i) for i in range(4)]
    d = WeakDict({keys[1]: 1})

    def action():
        d[keys[0]] = "from __del__"  # the key being overwritten right now
        d[keys[2]] = 2
        d[keys[1]] = "x"

    d[keys[0]] = OnDel(action)
    d[keys[0]] = "outer"
    assert d[keys[0]] in ("outer", "from __del__")
    assert (d[keys[1]], d[keys[2]]) == ("x", 2) and len(d) == 3


def test_delitem_drops_value_that_kills_other_keys(WeakDict):
    keys = [Key(i) for i in range(5)]
    d = WeakDict()
    holder = {"k": [keys.pop(3), keys.pop(2)]}  # the only strong refs to keys 2 and 3
    d.update({k: k.tag for k in keys + holder["k"]})
    d[keys[0]] = OnDel(lambda: holder.clear())
    del d[keys[0]]  # value dies -> keys 2 and 3 die inside __delitem__
    assert tags(d) == [1, 4]


def test_pop_and_popitem_with_values_that_kill_keys(WeakDict):
    keys = [Key(i) for i in range(6)]
    d = WeakDict()
    only = [keys.pop(5), keys.pop(4)]
    d.update({k: k.tag for k in keys + only})
    d[keys[0]] = OnDel(lambda: only.clear())
    d.pop(keys[0])  # the value dies as pop's result is discarded
    assert tags(d) == [1, 2, 3]
    d[keys[3]] = OnDel(lambda: d.pop(keys[1]))
    d.popitem()  # pops key 3 (last inserted live), its value deletes key 1
    assert tags(d) == [2]


def test_clear_with_values_holding_only_refs_to_other_keys(WeakDict):
    d = WeakDict()
    # a chain: value of key i holds key i + 1 (its only strong reference)
    first = Key(0)
    k = first
    for i in range(1, 200):
        nxt = Key(i)
        d[k] = nxt
        k = nxt
    d[k] = None
    del k, nxt
    assert len(d) == 200
    d.clear()
    assert len(d) == 0 and list(d) == []
    d[first] = 1
    assert len(d) == 1


def test_clear_where_values_reenter_the_dict(WeakDict):
    keys = [Key(i) for i in range(10)]
    d = WeakDict()
    log = []

    def action():
        log.append(len(d))
        list(d.items())
        d[keys[9]] = "reinserted"

    d.update({k: OnDel(action) for k in keys[:5]})
    d.clear()
    # torch's clear() pops one item at a time (so each __del__ sees a smaller dict), ferrodyn's
    # empties the table first; either way every value was dropped and clear() leaves it empty,
    # the entries inserted meanwhile included.
    assert len(log) == 5
    assert len(d) == 0 and list(d.values()) == []


def test_update_overwrites_whose_old_values_delete_keys(WeakDict):
    keys = [Key(i) for i in range(6)]
    d = WeakDict({k: k.tag for k in keys})
    d[keys[0]] = OnDel(lambda: d.pop(keys[5], None))
    d.update({keys[0]: "a", keys[4]: "b"})
    assert tags(d) == [0, 1, 2, 3, 4]
    assert (d[keys[0]], d[keys[4]]) == ("a", "b")


def test_key_death_cascades(WeakDict):
    d = WeakDict()
    first = Key(0)
    k = first
    for i in range(1, 50):
        nxt = Key(i)
        d[k] = nxt  # key i's value holds key i+1
        k = nxt
    del k, nxt
    other = Key(-1)
    d[other] = "stays"
    assert len(d) == 50
    del first  # 49 deaths cascade through the weakref callbacks
    assert len(d) == 1 and d[other] == "stays"


def test_long_cascade_is_not_recursive():
    # ferrodyn only: torch's Python callbacks would hit the recursion limit; ours must neither
    # overflow the C stack nor leave entries behind.
    d = fweak.WeakIdKeyDictionary()
    first = Key(0)
    k = first
    for i in range(1, 100_000):
        nxt = Key(i)
        d[k] = (nxt,)
        k = nxt
    del k, nxt
    assert len(d) == 99_999
    del first
    assert len(d) == 0


def test_key_callback_of_another_weakref_mutates_dict(WeakDict):
    keys = [Key(i) for i in range(5)]
    d = WeakDict({k: k.tag for k in keys})
    doomed = keys.pop(0)
    r = weakref.ref(doomed, lambda _: (d.pop(keys[0]), d.__setitem__(keys[1], "cb")))
    del doomed
    assert r() is None
    assert tags(d) == [2, 3, 4] and d[keys[1]] == "cb"


def test_keys_dying_inside_iteration_loop_body(WeakDict):
    keys = [Key(i) for i in range(30)]
    d = WeakDict()
    for i, k in enumerate(keys):
        d[k] = OnDel(lambda: None) if i % 2 else i
    seen = []
    for k, v in d.items():
        seen.append(k.tag)
        if k.tag == 5:
            del keys[6:20]  # 14 keys die: their values' __del__ run inside the iteration
        del k, v
    assert seen == list(range(6)) + list(range(20, 30))
    assert len(d) == 16


def test_gc_cycle_through_the_dict(WeakDict):
    d = WeakDict()
    k = Key(0)
    k.d = d
    d[k] = [d, k]  # value -> dict and key; key -> dict
    probe_d, probe_k = weakref.ref(d), weakref.ref(k)
    del d, k
    gc.collect()
    assert probe_d() is None and probe_k() is None


def test_gc_collects_keys_whose_values_reference_them_while_dict_lives(WeakDict):
    # value -> key keeps the key alive (as in any weak-key dict) until the entry is deleted
    d = WeakDict()
    k = Key(0)
    d[k] = [k]
    probe = weakref.ref(k)
    del k
    gc.collect()
    assert probe() is not None and len(d) == 1
    d.clear()
    gc.collect()
    assert probe() is None


def test_del_of_value_during_gc_touches_dict(WeakDict):
    d = WeakDict()
    keys = [Key(i) for i in range(10)]
    for k in keys:
        d[k] = k.tag

    class Cyclic:
        def __init__(self):
            self.me = self

        def __del__(self):
            d[keys[0]] = "gc"
            d.pop(keys[1], None)

    d[keys[2]] = Cyclic()
    d[keys[2]] = "replaced"  # the Cyclic value is now garbage in a cycle
    gc.collect()
    assert d[keys[0]] == "gc" and keys[1] not in d and len(d) == 9


def test_threads_hammering_one_dict(WeakDict):
    d = WeakDict()
    shared_keys = [Key(i) for i in range(64)]
    errors = []

    def worker(seed):
        try:
            mine = []
            for i in range(3000):
                k = shared_keys[(i * 7 + seed) % 64]
                d[k] = i
                d.get(k)
                d.pop(shared_keys[(i * 5 + seed) % 64], None)
                t = Key(-i)
                d[t] = OnDel(lambda: d.pop(k, None)) if i % 3 == 0 else i
                mine.append(t)
                if len(mine) > 10:
                    mine.pop(0)  # a key dies
                if i % 100 == 0:
                    try:
                        list(d.items())
                    except RuntimeError as e:  # another thread inserted meanwhile: allowed
                        # ("dictionary changed size / keys changed during iteration")
                        assert "changed" in str(e) and "during iteration" in str(e)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    run_interleaved(functools.partial(worker, s) for s in range(4))
    assert errors == []
    gc.collect()
    assert all(isinstance(k, Key) for k in d)
    assert len(d) == len(list(d)) <= 64


def test_values_dropped_with_the_dict_cannot_reach_it(WeakDict):
    k = Key(0)
    d = WeakDict()
    probe = weakref.ref(d)
    seen = []
    d[k] = OnDel(lambda: seen.append(probe()))
    d[Key(1)] = None  # an entry whose key is already dead
    del d
    gc.collect()
    assert seen == [None]


def test_keys_outliving_their_dict_die_quietly(WeakDict):
    keys = [Key(i) for i in range(100)]
    d = WeakDict({k: OnDel(lambda: None) for k in keys})
    it = iter(d)
    assert next(it) is keys[0]
    del d  # the iterator keeps (what it needs of) the dictionary alive
    del keys[:50]
    assert [k.tag for k in it] == list(range(50, 100))
    del keys

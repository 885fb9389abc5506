"""ferrodyn.weak (rust/weak): what only ferrodyn's dictionaries have or decide.

The exact dictionary (lookups of keys that cannot be weakly referenced miss instead of raising),
the refused `ref_type`s, reference counts of values and keys, garbage-collector support, Python
subclasses. The behaviour shared with torch.utils.weak is tested against both in test_weak.py.
"""

import collections.abc
import copy
import gc
import sys
import weakref

import pytest
import torch

import ferrodyn.weak as fweak

NOT_WEAKREFABLE = [13, "str", (1, 2), None, 1.5]


def T(n=1):
    return torch.randn(n)


class Obj:
    def __init__(self, tag=0):
        self.tag = tag



def test_unsupported_ref_type_is_refused():
    with pytest.raises(TypeError, match="ref_type"):
        fweak.WeakIdKeyDictionary(ref_type=weakref.ref)
    with pytest.raises(TypeError, match="ref_type"):
        fweak.WeakIdKeyDictionary(ref_type=3)


def test_exact_dict_basics():
    E = fweak.WeakKeyExactDictionary
    a, b = torch.zeros(2), torch.zeros(2)
    d = E()
    d[a] = 1
    d[b] = 2
    assert (d[a], d[b], len(d)) == (1, 2, 2)
    assert type(d.copy()) is E and d.copy() == d
    assert type(copy.deepcopy(d)) is E
    assert type(d | {}) is E
    assert repr(d).startswith("<WeakKeyExactDictionary at 0x")
    del a
    assert list(d.values()) == [2]
    e = E({b: 3})
    assert e[b] == 3


@pytest.mark.parametrize("key", NOT_WEAKREFABLE, ids=repr)
def test_exact_dict_lookups_of_non_weakrefable_keys_miss(key):
    live = T()
    d = fweak.WeakKeyExactDictionary({live: 1})
    assert key not in d
    assert d.get(key) is None and d.get(key, 5) == 5
    assert d.pop(key, 5) == 5
    with pytest.raises(KeyError):
        d[key]
    with pytest.raises(KeyError):
        del d[key]
    with pytest.raises(KeyError):
        d.pop(key)
    for insert in (lambda: d.__setitem__(key, 1), lambda: d.setdefault(key, 1),
                   lambda: d.update([(key, 1)])):
        with pytest.raises(TypeError, match="cannot create weak reference"):
            insert()
    assert len(d) == 1


def test_values_are_released():
    d = fweak.WeakIdKeyDictionary()
    k = Obj()
    v = Obj()
    base = sys.getrefcount(v)
    d[k] = v
    assert sys.getrefcount(v) == base + 1
    d[k] = v  # overwrite with itself: no extra reference
    assert sys.getrefcount(v) == base + 1
    del d[k]
    assert sys.getrefcount(v) == base
    d[k] = v
    del k
    assert sys.getrefcount(v) == base


def test_no_reference_leak_over_many_operations():
    d = fweak.WeakIdKeyDictionary()
    v = Obj()
    keys = [Obj(i) for i in range(100)]
    base_v, base_k = sys.getrefcount(v), sys.getrefcount(keys[0])
    for _ in range(100):
        for k in keys:
            d[k] = v
            d.get(k)
            _ = d[k]
            _ = k in d
        list(d.items())
        d.copy()
        for k in keys[:50]:
            d.pop(k)
        d.clear()
    gc.collect()
    k0 = keys[0]
    counts = sys.getrefcount(v), sys.getrefcount(k0) - 1  # minus the k0 name
    assert counts == (base_v, base_k)


def test_dictionary_is_weakly_referenceable_and_collected_in_a_cycle():
    d = fweak.WeakIdKeyDictionary()
    k = Obj()
    d[k] = d  # the dictionary holds itself
    k.d = d  # and its key holds it too
    probe = weakref.ref(d)
    del d, k
    gc.collect()
    assert probe() is None


def test_python_subclass():
    class Sub(fweak.WeakIdKeyDictionary):
        def extra(self):
            return len(self)

    k = T()
    s = Sub({k: 1})
    assert s.extra() == 1 and s[k] == 1
    assert isinstance(s, collections.abc.MutableMapping)

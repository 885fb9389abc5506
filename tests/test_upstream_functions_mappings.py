"""`dict(x)`, `dict(x, **kw)` and `d.update(x)` where `x` is not a plain dict: CPython reads
anything with a `keys` attribute as a mapping (`keys()` taken whole, then `x[key]` for each)
and only iterates other objects for key/value pairs. Found by running PyTorch's
test/dynamo/test_functions.py (`test_dict_mutable_map`) through ferrodyn: a user
`MutableMapping` was iterated for pairs, so two-character keys were split into key and value.
Each case is compared with eager (results and the mapping afterwards) and with torch.compile's
graph count."""

import collections
from collections.abc import MutableMapping

import pytest
import torch

from compiled_vs_eager import run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Store(MutableMapping):
    """A mapping whose iteration yields its keys: strings of length 2, which unpack as pairs."""

    def __init__(self, **items):
        self._d = dict(items)

    def __getitem__(self, k):
        return self._d[k]

    def __setitem__(self, k, v):
        self._d[k] = v

    def __delitem__(self, k):
        del self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


class KeysAndGetitem:
    """Not a Mapping subclass: `keys` and `__getitem__` only; iterating it gives one pair that
    CPython never reads."""

    def keys(self):
        return ["ab", "cd"]

    def __getitem__(self, k):
        return k.upper()

    def __iter__(self):
        return iter(["xy"])


class IterOverridden(dict):
    """A dict subclass with its own `__iter__`: CPython's merge goes through keys()."""

    def __iter__(self):
        return iter(["no"])


def _store():
    return Store(ab=torch.ones(3), cd=2)


def dict_of(x, m):
    return dict(m), x + 1


def dict_of_with_kwargs(x, m):
    return dict(m, ef=3), x * 2


def update_from(x, m):
    d = {"zz": 0}
    d.update(m)
    return d, x - 1


def ordered_dict_of(x, m):
    return collections.OrderedDict(m), x + 3


def update_then_use(x, m):
    d = {}
    d.update(m)
    return x * len(d) if "cd" in d else x


@pytest.mark.parametrize("fn", [dict_of, dict_of_with_kwargs, update_from, ordered_dict_of, update_then_use])
@pytest.mark.parametrize("make", [_store, KeysAndGetitem, lambda: IterOverridden(ab=1, cd=torch.ones(3))],
                         ids=["mutable_mapping", "keys_and_getitem", "dict_subclass_iter"])
def test_mapping_argument_is_read_through_keys(fn, make):
    want, got, fd, tc = run_all(fn, torch.randn(3), make())
    # a mapping whose keys() the converter cannot follow (a KeysView over a user class) runs
    # the frame eagerly; otherwise the frame is one graph, as torch.compile's
    assert fd in (0, tc), (fd, tc)


@pytest.mark.parametrize("fn", [dict_of, dict_of_with_kwargs, ordered_dict_of])
@pytest.mark.parametrize("make", [_store, KeysAndGetitem], ids=["mutable_mapping", "keys_and_getitem"])
def test_mapping_constructors_are_captured(fn, make):
    _, _, fd, tc = run_all(fn, torch.randn(3), make())
    assert fd == tc == 1, (fd, tc)


STORE = Store(ab=torch.ones(3), cd=2)


def from_global(x):
    return dict(STORE), x + 1


def test_global_mapping_changed_between_calls():
    """The mapping read at compile time is guarded: after it changes, the next call sees the
    new keys and values, as eager does."""
    import ferrodyn
    from counting_backend import CountingBackend
    compiled = ferrodyn.compile(from_global, backend=CountingBackend())
    x = torch.randn(3)
    for change in (lambda: None, lambda: STORE.__setitem__("ef", 5), lambda: STORE.__setitem__("ab", 7)):
        change()
        want, got = from_global(x), compiled(x)
        assert list(want[0]) == list(got[0])
        assert all(torch.equal(torch.as_tensor(want[0][k]), torch.as_tensor(got[0][k])) for k in want[0])
        assert torch.equal(want[1], got[1])


def bad_pairs(x, seq):
    d = {}
    d.update(seq)
    return d, x + 1


@pytest.mark.parametrize("seq", [["abc"], [("a",)], [1]], ids=["len3", "len1", "int"])
def test_bad_pair_sequence_raises_like_eager(seq):
    """A sequence whose items are not pairs raises eager's exception type (the frame runs
    eagerly), never a value built from the wrong items."""
    run_all(bad_pairs, torch.randn(3), seq)

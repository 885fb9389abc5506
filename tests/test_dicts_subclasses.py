"""Instances of dict subclasses passed into the frame (variables/dict_objects.py): their items
are one tracker per object, mutable, and replayed through the builtin base's own methods (an
override of `__setitem__` traced once is not run again by the replay); `__getattr__ = dict.get`
("dotdict") reads the items; a class with `__missing__` is not read by guards (a guard reading
a key that has gone ran user code: a wrong mutated state). Compared with eager (results, the
object's items and type afterwards) and with torch.compile's graph count."""

import pytest
import torch

import ferrodyn
from compiled_vs_eager import run_all
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class SimpleDict(dict):
    pass


class PlusOneSetItem(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value + 1)


class dotdict(dict):
    __getattr__ = dict.get
    __setattr__ = dict.__setitem__
    __delattr__ = dict.__delitem__


def mutate_and_read(sd, x):
    for value in sd.values():
        x = x * value
    sd[6] = 14
    for key in sd:
        x = x * key
    for k, v in sd.items():
        x = x * k + v
    x = x * (2 if 1 in sd else 3)
    x = x * sd.get(2, 0) * sd.get(3, 4)
    del sd[4]
    sd.update({7: 1})
    return len(sd) * x


def _compare_mutation(fn, make):
    x = torch.randn(3)
    d_eager, d_comp = make(), make()
    backend = CountingBackend()
    want = fn(d_eager, x.clone())
    got = ferrodyn.compile(fn, backend=backend)(d_comp, x.clone())
    assert torch.allclose(want, got)
    assert type(d_comp) is type(d_eager) and list(d_comp.items()) == list(d_eager.items())
    torch._dynamo.reset()
    tc = CountingBackend()
    torch.compile(fn, backend=tc)(make(), x.clone())
    return backend.count, tc.count


def test_subclass_items_mutated_and_replayed():
    fd, tc = _compare_mutation(mutate_and_read, lambda: SimpleDict({2: 5, 4: 10}))
    assert fd == 1 and tc <= 1, (fd, tc)


def setitem_through_override(d, x):
    d["k"] = 10
    d["j"] = d["k"] * 2
    return x * d["j"]


def test_override_runs_once():
    """The traced `__setitem__` override added 1; the replay must not add it again."""
    fd, tc = _compare_mutation(setitem_through_override, lambda: PlusOneSetItem(a=1))
    assert fd == 1 and tc <= 1, (fd, tc)


CONFIG = dotdict({"a": 1, "b": 2})


def read_dotdict(x):
    x3 = x * CONFIG.get("a", 3)
    return x3 + CONFIG.b + (CONFIG.missing is None)


def test_dotdict_getattr_is_dict_get():
    _, _, fd, tc = run_all(read_dotdict, torch.randn(3))
    assert fd == 1 and tc <= 1, (fd, tc)


def test_dotdict_change_recompiles():
    compiled = ferrodyn.compile(read_dotdict, backend=CountingBackend())
    x = torch.randn(3)
    assert torch.equal(compiled(x), read_dotdict(x))
    CONFIG["b"] = 5
    try:
        assert torch.equal(compiled(x), read_dotdict(x))
    finally:
        CONFIG["b"] = 2


LOG = []


class Missing(dict):
    def __missing__(self, key):
        LOG.append(key)
        return 5


def read_a(x, d):
    return x * d["a"]


def test_missing_is_not_run_by_guards():
    compiled = ferrodyn.compile(read_a, backend=CountingBackend())
    x = torch.ones(2)
    LOG.clear()
    assert torch.equal(compiled(x, Missing(a=2)), x * 2)
    assert torch.equal(compiled(x, Missing(b=3)), x * 5)
    assert LOG == ["a"]  # eager calls __missing__ once


def test_dict_subclass_argument_copy_is_independent():
    def fn(x, d):
        c = dict(d)
        c["new"] = 1
        d["other"] = 2
        return x + len(c) + len(d), c
    want, got, fd, tc = run_all(fn, torch.randn(3), SimpleDict(a=1))
    assert fd == 1 and tc <= 1, (fd, tc)


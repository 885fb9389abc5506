"""Instances of dict subclasses from the frame whose class overrides `__getitem__` and reads
its items through `super().__getitem__` (transformers' `ACT2FN`, an OrderedDict subclass
that instantiates the class it stores): the items are read and guarded through the storage
(`dict.__getitem__(obj, k)`, variables/dict_objects.py + source.DictItemSource), so a guard
never runs the override. Compared with eager (results, cache hits, a mutated mapping
recompiles) and with torch.compile's graph count."""

import collections

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Instantier(collections.OrderedDict):
    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


class PlainBase(dict):
    def __getitem__(self, key):
        return super().__getitem__(key) * 2


ACTS = Instantier({"relu": torch.nn.ReLU, "elu": (torch.nn.ELU, {"alpha": 0.5})})
SCALES = PlainBase(a=3, b=4)


def use_acts(x):
    return ACTS["relu"](x) + ACTS["elu"](x - 1) * SCALES["b"]


def test_override_reads_storage_in_one_graph():
    x = torch.randn(5)
    want = use_acts(x)
    fd = CountingBackend()
    compiled = ferrodyn.compile(use_acts, backend=fd)
    assert torch.allclose(want, compiled(x))
    # a cache hit: a guard running the override would see a new module object and fail
    assert torch.allclose(want, compiled(x)) and fd.count == 1
    torch._dynamo.reset()
    tc = CountingBackend()
    torch.compile(use_acts, backend=tc)(x)
    assert fd.count <= tc.count, (fd.count, tc.count)


def test_changed_item_recompiles():
    x = torch.randn(5)
    fd = CountingBackend()
    compiled = ferrodyn.compile(use_acts, backend=fd)
    assert torch.allclose(compiled(x), use_acts(x))
    try:
        dict.__setitem__(SCALES, "b", 7)
        dict.__setitem__(ACTS, "relu", torch.nn.Tanh)
        assert torch.allclose(compiled(x), use_acts(x))
        assert fd.count == 2
    finally:
        dict.__setitem__(SCALES, "b", 4)
        dict.__setitem__(ACTS, "relu", torch.nn.ReLU)
    assert torch.allclose(compiled(x), use_acts(x))

"""Descriptors of Python code read through an instance. Found by running
`test_dict_descriptor_interaction` (PyTorch test/dynamo/_test_misc_part2.py) through
ferrodyn: a data descriptor's value was read with `getattr` at compile time, so a read after
the frame changed `obj.__dict__` returned the old value; and a non-data descriptor (`__get__`
only) read through an instance returned the descriptor object itself (the class's view) instead
of calling `__get__(obj, cls)`. Each case compares results and the object's state afterwards
with eager, and graph counts with torch.compile's."""

import copy
import functools

import pytest
import torch

import ferrodyn
from compiled_vs_eager import same
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Getter:
    """A non-data descriptor: reads the instance dict."""

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__.get("_internal", "default")


class GetterSetter(Getter):
    """A data descriptor: `__set__` writes a decorated value."""

    def __set__(self, obj, value):
        obj.__dict__["_internal"] = f"desc_{value}"


class Scaled:
    """A non-data descriptor returning a number computed from the instance."""

    def __get__(self, obj, objtype=None):
        return 10 if obj is None else obj.k * 3


class Holder:
    plain = Getter()
    both = GetterSetter()
    scaled = Scaled()

    def __init__(self):
        self._internal = "x"
        self.k = 2

    @functools.cached_property
    def cached(self):
        return self.k * 5


def read_write_read_plain(x, obj):
    a = obj.plain
    obj.__dict__["_internal"] = "direct"
    return x + 1, a, obj.plain


def read_write_read_data(x, obj):
    a = obj.both
    obj._internal = "direct"
    return x + 1, a, obj.both


def set_through_data_descriptor(x, obj):
    obj.both = "hello"
    a = obj.both
    obj.__dict__["_internal"] = "direct"
    return x + 1, a, obj.both


def scaled_value(x, obj):
    obj.k = 4
    return x * obj.scaled, type(obj).scaled


def shadowed_non_data(x, obj):
    obj.__dict__["plain"] = "mine"
    return x + 1, obj.plain


def cached_property_twice(x, obj):
    a = obj.cached
    obj.k = 100
    return x * a + obj.cached


@pytest.mark.parametrize("fn", [read_write_read_plain, read_write_read_data, set_through_data_descriptor,
                                scaled_value, shadowed_non_data, cached_property_twice])
def test_descriptor_read_through_instance(fn):
    objs = [Holder() for _ in range(3)]
    want = fn(torch.ones(2), objs[0])
    fd = CountingBackend()
    got = ferrodyn.compile(fn, backend=fd)(torch.ones(2), objs[1])
    assert same(want, got), (want, got)
    assert vars(objs[0]) == vars(objs[1])
    tc = CountingBackend()
    torch._dynamo.reset()
    torch.compile(fn, backend=tc)(torch.ones(2), objs[2])
    torch._dynamo.reset()
    assert fd.count <= max(tc.count, 2), (fd.count, tc.count)


def test_descriptor_value_follows_the_instance_between_calls():
    """The descriptor runs on every call's instance state (no value frozen at compile time)."""
    def fn(x, obj):
        return x * obj.scaled
    compiled = ferrodyn.compile(fn, backend=CountingBackend())
    obj = Holder()
    for k in (2, 3, 7):
        obj.k = k
        assert torch.equal(compiled(torch.ones(2), obj), fn(torch.ones(2), obj))


class DictSub(dict):
    pass


def test_classmethod_descriptor_through_instance():
    def fn(x, d):
        return x + len(d.fromkeys("ab")), type(d.fromkeys("c")).__name__
    want = fn(torch.ones(2), DictSub())
    fd = CountingBackend()
    got = ferrodyn.compile(fn, backend=fd)(torch.ones(2), DictSub())
    assert same(want, got), (want, got)

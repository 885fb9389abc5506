"""A mappingproxy reached from the frame is a read-only view of a dict the frame may also
change by another way: as a dict argument, through an object's attribute stores, or through
class-attribute stores. The converter models the proxy as a snapshot, so such a frame is
refused (graph break or eager) and eager's values come back. Found by running the
`test_dict_view_mapping_reflects_mutation` pattern of PyTorch's test/dynamo/test_dicts.py
through ferrodyn: `len(m)` of `m = d.keys().mapping` stayed 0 after `d["foo"] = "bar"`.
Each case compares results and the dict afterwards with eager, and graph counts with
torch.compile's."""

import types

import pytest
import torch

import ferrodyn
from compiled_vs_eager import run_all, same
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def keys_mapping(d):
    return d.keys().mapping


def proxy_of(d):
    return types.MappingProxyType(d)


def write_then_read(x, m, d):
    d["foo"] = "bar"
    return x + len(m), dict(m), "foo" in m


def read_write_read(x, m, d):
    before = len(m)
    d["k"] = 2
    return x * before + len(m), list(m)


def pop_then_read(x, m, d):
    d.pop("a")
    return x + len(m), sorted(m)


def read_only(x, m, d):
    return x * m["a"] + len(m)


def _check(fn, make_view):
    """Eager and ferrodyn on fresh (dict, view) pairs: results and the dict afterwards."""
    d_want, d_got = {"a": 1}, {"a": 1}
    want = fn(torch.ones(2), make_view(d_want), d_want)
    fd = CountingBackend()
    got = ferrodyn.compile(fn, backend=fd)(torch.ones(2), make_view(d_got), d_got)
    assert same(want, got), (want, got)
    assert d_want == d_got
    d_tc = {"a": 1}
    tc = CountingBackend()
    torch._dynamo.reset()
    torch.compile(fn, backend=tc)(torch.ones(2), make_view(d_tc), d_tc)
    torch._dynamo.reset()
    return fd.count, tc.count


@pytest.mark.parametrize("make_view", [keys_mapping, proxy_of])
@pytest.mark.parametrize("fn", [write_then_read, read_write_read, pop_then_read])
def test_view_of_a_dict_the_frame_changes(fn, make_view):
    fd, tc = _check(fn, make_view)
    assert fd <= tc, (fd, tc)


@pytest.mark.parametrize("make_view", [keys_mapping, proxy_of])
def test_view_of_an_unchanged_dict_is_captured(make_view):
    fd, tc = _check(read_only, make_view)
    assert fd == tc == 1, (fd, tc)


class Obj:
    def __init__(self):
        self.a = 1


def instance_dict_view(x, obj, m):
    obj.z = 5
    return x + len(m), "z" in m


def test_view_of_an_instance_dict_written_by_attribute_stores():
    o1, o2 = Obj(), Obj()
    want = instance_dict_view(torch.ones(2), o1, types.MappingProxyType(vars(o1)))
    fd = CountingBackend()
    got = ferrodyn.compile(instance_dict_view, backend=fd)(torch.ones(2), o2,
                                                           types.MappingProxyType(vars(o2)))
    assert same(want, got), (want, got)
    assert vars(o1) == vars(o2)


class Namespace:
    flag = 1


def class_namespace_view(x):
    before = len(Namespace.__dict__)
    Namespace.extra = 3
    return x + len(Namespace.__dict__) - before, "extra" in Namespace.__dict__


def test_class_namespace_view_after_class_attribute_store():
    results, counts = [], []
    for compiler in (lambda f, backend: f, ferrodyn.compile, torch.compile):
        if hasattr(Namespace, "extra"):
            del Namespace.extra
        torch._dynamo.reset()
        counter = CountingBackend()
        results.append(compiler(class_namespace_view, backend=counter)(torch.ones(2)))
        counts.append(counter.count)
        assert Namespace.extra == 3
    del Namespace.extra
    torch._dynamo.reset()
    assert same(results[0], results[1]), results
    assert counts[1] <= counts[2], counts


def test_resumed_frame_returns_a_proxy_made_before_the_break():
    """A proxy made in the frame, carried across a graph break and returned: the entry
    rebuilds it from the resume function's argument (it used to fail to generate)."""
    def fn(x):
        d = {"a": 2, "b": 3}
        mp = types.MappingProxyType(d)
        print("", end="")
        return mp, torch.sin(x * mp["a"])
    want, got, fd, tc = run_all(fn, torch.ones(2))
    assert type(got[0]) is types.MappingProxyType
    assert fd == tc, (fd, tc)

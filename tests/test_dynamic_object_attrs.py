"""Automatic dynamic shapes for tensors held by an object passed in (a KV cache: transformers'
`DynamicCache.layers[i].keys` grows by one position per decode step): after one recompile the
changed dim is symbolic, so later lengths hit the cache, as torch.compile; module state
(`self`'s tensors, parameters, buffers) keeps static shapes. Compiled vs eager (results and the
object's mutated state), graph counts against torch.compile's in the same test."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Layer:
    def __init__(self, keys):
        self.keys = keys


class Cache:
    def __init__(self, n):
        self.layers = [Layer(torch.zeros(2, n)) for _ in range(2)]


def decode_step(x, cache):
    out = x
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys, out[:, None]], dim=1)
        out = out + layer.keys.sum(dim=1)
    return out


def _decode(f, steps=5):
    cache = Cache(3)
    x = torch.ones(2)
    outs = []
    for _ in range(steps):
        x = f(x, cache)
        outs.append(x)
    return outs, [layer.keys for layer in cache.layers]


def test_growing_cache_tensor_goes_dynamic_like_torch():
    ours, theirs = CountingBackend(), CountingBackend()
    want = _decode(decode_step)
    got = _decode(ferrodyn.compile(decode_step, backend=ours))
    torch._dynamo.reset()
    _decode(torch.compile(decode_step, backend=theirs))
    torch._dynamo.reset()
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        torch.testing.assert_close(a, b)
    assert ours.count == theirs.count == 2  # static first, then the length is symbolic


class Scaled(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("table", torch.ones(n))

    def forward(self, x):
        return x * self.table.sum()


def test_module_buffer_of_another_size_stays_static():
    ours, theirs = CountingBackend(), CountingBackend()
    f = ferrodyn.compile(lambda m, x: m(x), backend=ours)
    g = torch.compile(lambda m, x: m(x), backend=theirs)
    x = torch.ones(3)
    for n in (2, 3, 4):
        m = Scaled(n)
        torch.testing.assert_close(f(m, x), m(x))
        g(m, x)
    torch._dynamo.reset()
    assert ours.count == theirs.count == 3  # buffers keep static shapes: one graph per size


class Window:
    def __init__(self):
        self.seen = 4  # a position counter kept on the object (transformers' cumulative_length_int)


def counted_step(x, state):
    state.seen += 1
    return x * state.seen


def test_int_counter_on_an_object_goes_dynamic_like_torch():
    ours, theirs = CountingBackend(), CountingBackend()
    runs = {}
    for name, f in (("eager", counted_step), ("ferrodyn", ferrodyn.compile(counted_step, backend=ours)),
                    ("torch", torch.compile(counted_step, backend=theirs))):
        w = Window()
        runs[name] = ([f(torch.ones(2), w) for _ in range(5)], w.seen)
    torch._dynamo.reset()
    for a, b in zip(runs["ferrodyn"][0], runs["eager"][0]):
        torch.testing.assert_close(a, b)
    assert runs["ferrodyn"][1] == runs["eager"][1] == 9
    assert ours.count <= theirs.count and ours.count == 2  # then the counter is a SymInt

"""Dicts from the frame keyed by tensors or parameters, and defaultdicts from the frame
(variables/dict_keys.py `build_object_keyed_dict`): keys are reached by position (`list(d)[i]`,
a Rust accessor on exact dicts and defaultdicts) and built as inputs, values by position
(`list(d.values())[i]`); which input is which key is pinned by the aliasing guard; a guard never
reads a defaultdict's `d[k]` (it would run `__missing__`). Compared with eager (results and the
dict afterwards), graph counts with torch.compile's, and guard outcomes (a new key order,
another key object, an argument that is now another key recompile)."""

from collections import defaultdict

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def lookup(d, x):
    return d[x] + 3


def _counts(fn, calls):
    """Run `calls` (argument tuples, made fresh for each compiler) through eager, ferrodyn and
    torch.compile; results must be eager's; returns the two graph counts."""
    fd, tc = CountingBackend(), CountingBackend()
    compiled, reference = ferrodyn.compile(fn, backend=fd), torch.compile(fn, backend=tc)
    for args in calls:
        want = fn(*args)
        got = compiled(*args)
        assert torch.equal(want, got), (want, got)
        reference(*args)
    torch._dynamo.reset()
    return fd.count, tc.count


def test_tensor_keys_order_and_identity():
    g = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(10, generator=g) for _ in range(3))
    a1 = {x: y, 3: z}
    a2 = {3: z, x: y * 2}
    a3 = {z: x, x: z}
    calls = [(a1, x), (a1, x), (a2, x), (a3, x), (a3, z)]
    fd, tc = _counts(lookup, calls)
    assert fd == tc == 4, (fd, tc)


def test_fresh_key_object_recompiles_not_misses():
    """Another dict with other key tensors of the same metadata: the lookup must find the new
    key (never a value read through a stale key)."""
    compiled = ferrodyn.compile(lookup, backend=CountingBackend())
    for _ in range(3):
        k, v = torch.randn(4), torch.randn(4)
        assert torch.equal(compiled({k: v, "s": 1}, k), v + 3)


class Opt:
    def __init__(self, params):
        self.params = list(params)
        self.state = {}
        for p in self.params:
            self.state[p] = {"step": 0, "avg": torch.zeros_like(p)}


def step(opt, lr):
    for p in opt.params:
        st = opt.state[p]
        st["step"] += 1
        st["avg"].mul_(0.9).add_(p, alpha=0.1)
        p.sub_(lr * st["avg"])
    return len(opt.state)


def test_state_keyed_by_parameters():
    """An optimizer-like state dict keyed by parameters, read and mutated through the keys."""
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(3)) for _ in range(2)]
    eager = Opt([p.detach().clone().requires_grad_() for p in ps])
    comp = Opt([p.detach().clone().requires_grad_() for p in ps])
    backend = CountingBackend()
    compiled = ferrodyn.compile(step, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            assert step(eager, 0.5) == compiled(comp, 0.5)
    for pe, pc in zip(eager.params, comp.params):
        assert torch.allclose(pe, pc)
        assert eager.state[pe]["step"] == comp.state[pc]["step"] == 3
        assert torch.allclose(eager.state[pe]["avg"], comp.state[pc]["avg"])
        assert list(comp.state) == comp.params  # the keys are still the parameter objects


def add_key(d, k, v):
    d[k] = v * 2
    return len(d)


def test_mutation_of_tensor_keyed_dict_is_replayed():
    k1, k2, v = torch.randn(2), torch.randn(2), torch.randn(2)
    d_eager, d_comp = {k1: 1}, {k1: 1}
    assert add_key(d_eager, k2, v) == ferrodyn.compile(add_key, backend=CountingBackend())(
        d_comp, k2, v)
    assert [id(k) for k in d_comp] == [id(k) for k in d_eager] == [id(k1), id(k2)]
    assert torch.equal(d_comp[k2], d_eager[k2])


def iterate_keys(d):
    total = 0
    for k, v in d.items():
        total = total + k * v
    return total


def test_iterating_tensor_keys_uses_them_as_inputs():
    a, b = torch.randn(3), torch.randn(3)
    fd, tc = _counts(iterate_keys, [({a: 2, b: 3},), ({a: 2, b: 3},), ({b: 2, a: 3},)])
    # keys and values are read by position: the reordered dict fits the same graph
    assert fd == 1 <= tc, (fd, tc)


class LazyStateOpt:
    """torch.optim's layout: `state` is a defaultdict(dict) filled on the first step."""

    def __init__(self, params):
        self.params = list(params)
        self.state = defaultdict(dict)


def lazy_step(opt, lr):
    for p in opt.params:
        st = opt.state[p]
        if len(st) == 0:
            st["step"] = torch.zeros(())
            st["avg"] = torch.zeros_like(p)
        st["step"] += 1
        st["avg"].mul_(0.9).add_(p, alpha=0.1)
        p.sub_(lr * st["avg"])


def test_defaultdict_state_keyed_by_parameters():
    torch.manual_seed(0)
    ps = [torch.randn(3) for _ in range(2)]
    eager, comp = LazyStateOpt([p.clone() for p in ps]), LazyStateOpt([p.clone() for p in ps])
    ref = LazyStateOpt([p.clone() for p in ps])
    backend, tc = CountingBackend(), CountingBackend()
    compiled, reference = ferrodyn.compile(lazy_step, backend=backend), torch.compile(
        lazy_step, backend=tc)
    for _ in range(3):
        lazy_step(eager, 0.5)
        compiled(comp, 0.5)
        reference(ref, 0.5)
    torch._dynamo.reset()
    assert type(comp.state) is defaultdict and comp.state.default_factory is dict
    assert list(comp.state) == comp.params
    for pe, pc in zip(eager.params, comp.params):
        assert torch.allclose(pe, pc)
        assert comp.state[pc]["step"] == eager.state[pe]["step"] == 3
        assert torch.allclose(eager.state[pe]["avg"], comp.state[pc]["avg"])
    assert backend.count == tc.count == 2  # the first step fills the state: the second differs


def read_or_make(d, x):
    d["a"].append(1)
    return x * len(d["a"])


def test_defaultdict_from_frame_missing_key():
    compiled = ferrodyn.compile(read_or_make, backend=CountingBackend())
    x = torch.ones(2)
    for make in (lambda: defaultdict(list, a=[1]), lambda: defaultdict(list, b=[2]),
                 lambda: defaultdict(list, a=[1])):
        d_eager, d_comp = make(), make()
        assert torch.equal(read_or_make(d_eager, x), compiled(d_comp, x))
        assert d_comp == d_eager and list(d_comp) == list(d_eager)


def test_defaultdict_factory_change_recompiles():
    def fn(d, x):
        return x + len(d["k"])
    compiled = ferrodyn.compile(fn, backend=CountingBackend())
    x = torch.ones(2)
    for factory in (list, lambda: [1, 2], list):
        d_eager, d_comp = defaultdict(factory), defaultdict(factory)
        assert torch.equal(fn(d_eager, x), compiled(d_comp, x))
        assert d_comp == d_eager

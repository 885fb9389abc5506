"""The guard tree's replay path (remembered dict lookups proven current by dict / type version
tags, tensor metadata and types re-read every call): after every way of changing a compiled
module or its globals between calls, the replay never passes where the full path fails, and
the compiled call gives eager's result with torch.compile's graph count."""

from __future__ import annotations

import sys

import pytest
import torch
import torch._dynamo

import ferrodyn
from ferrodyn import _C
from counting_backend import CountingBackend

SCALE = 2  # read by Block.forward: an EQUALS guard on a global

# What a replay of an unchanged tree decides: True where dict versions are read (3.11, 3.12);
# None on 3.13, whose dict tags are not read (every replay defers to the full path there).
REPLAYED = None if _C._dict_version({}) is None else True


@pytest.fixture(autouse=True)
def _fresh(fresh_ferrodyn):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Block(torch.nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)
        self.scale = torch.nn.Parameter(torch.ones(n))
        self.register_buffer("shift", torch.zeros(n))
        self.gain = 1

    def forward(self, x):
        return (self.lin(x) * self.scale + self.shift) * self.gain * SCALE


class OtherBlock(Block):
    def forward(self, x):
        return super().forward(x) - 1


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block()
        self.b = Block()

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _tree():
    entries = _C.cache_entries(Net.forward.__code__)
    return entries[0].guards if entries else None


class Harness:
    """One module compiled by both frontends; `step()` calls them (and eager) and checks that
    the replay never contradicts the full path on the ferrodyn entry."""

    def __init__(self):
        torch.manual_seed(0)
        self.mod = Net()
        self.fd, self.tc = CountingBackend(), CountingBackend()
        self.opt = ferrodyn.compile(self.mod, backend=self.fd)
        self.ref = torch.compile(self.mod, backend=self.tc)
        self.x = torch.randn(3, 4)
        self.torch_reference = True
        for _ in range(3):  # compile, then fill the replay's memory, then replay
            self.step()
        tree = _tree()
        assert tree.replayable
        with torch.no_grad():  # the entry's global state
            assert tree._replay((self.mod, self.x), Net.forward.__globals__) is REPLAYED

    def differential(self):
        tree = _tree()
        args = (self.mod, self.x)
        g = Net.forward.__globals__
        with torch.no_grad():
            replayed = tree._replay(args, g)
            full = tree._full_check(args, g)
        assert replayed in (None, full), (replayed, full)
        return replayed, full

    def step(self):
        with torch.no_grad():
            expected = self.mod(self.x)
            got = self.opt(self.x)
            assert torch.allclose(got, expected)
            if self.torch_reference:
                assert torch.allclose(self.ref(self.x), expected)


def _mutations():
    def reassign_param(h):
        h.mod.a.scale = torch.nn.Parameter(torch.full((4,), 3.0))

    def replace_linear_weight(h):
        h.mod.b.lin.weight = torch.nn.Parameter(torch.randn(4, 4))

    def delete_and_readd_param(h):
        del h.mod.a.scale
        h.mod.a.scale = torch.nn.Parameter(torch.full((4,), -1.0))

    def reregister_buffer(h):
        h.mod.b.register_buffer("shift", torch.full((4,), -2.0))

    def swap_submodule(h):
        h.mod.a = Block()

    def swap_nested_submodule(h):
        h.mod.b.lin = torch.nn.Linear(4, 4, bias=False)

    def replace_instance_dict(h):
        d = dict(h.mod.__dict__)
        d["_modules"] = dict(d["_modules"], a=Block())
        h.mod.__dict__ = d

    def data_of_another_shape(h):
        with torch.no_grad():
            h.mod.a.scale.data = torch.full((1,), 2.0)

    def requires_grad_off(h):
        h.mod.a.scale.requires_grad_(False)

    def class_assignment(h):
        h.mod.b.__class__ = OtherBlock

    def plain_attribute(h):
        h.mod.a.gain = 5

    def global_changed(h):
        sys.modules[__name__].SCALE = 3

    def method_replaced(h):
        # torch.compile keeps running the old graph here too (no guard on the class's method
        # of an inlined submodule): only eager is the reference.
        h.torch_reference = False

        def forward(self, x):
            return self.lin(x) - self.scale

        Block.forward = forward

    def forward_hook(h):
        # torch.compile skips hook guards on submodules by default (skip_nnmodule_hook_guards)
        # and keeps running the old graph: only eager is the reference here.
        h.torch_reference = False
        h.mod.a.register_forward_hook(lambda m, i, o: o + 100)

    return [reassign_param, replace_linear_weight, delete_and_readd_param, reregister_buffer,
            swap_submodule, swap_nested_submodule, replace_instance_dict, data_of_another_shape,
            requires_grad_off, class_assignment, plain_attribute, global_changed, method_replaced,
            forward_hook]


@pytest.mark.parametrize("mutate", _mutations(), ids=lambda f: f.__name__)
def test_replay_after_mutation(mutate):
    saved_forward, saved_scale = Block.forward, SCALE
    try:
        h = Harness()
        mutate(h)
        replayed, full = h.differential()
        h.step()
        h.step()  # a hit on whatever entry the changed module uses now
        if h.torch_reference:
            assert h.fd.count == h.tc.count
        if _tree() is not None:
            h.differential()
    finally:
        Block.forward = saved_forward
        sys.modules[__name__].SCALE = saved_scale


def test_in_place_value_updates_keep_replaying():
    h = Harness()
    with torch.no_grad():
        h.mod.a.lin.weight.mul_(2)
        h.mod.b.shift.add_(1)
    h.step()
    assert h.differential() == (REPLAYED, True)
    assert h.fd.count == h.tc.count == 1


def test_a_new_module_at_a_reused_address_is_not_replayed():
    h = Harness()
    tree = _tree()
    g = Net.forward.__globals__
    for _ in range(20):  # new modules, some at the address of a freed one: never a stale pass
        m = Net()
        with torch.no_grad():
            m.a.scale.fill_(7.0)
            r = tree._replay((m, h.x), g)
            assert r in (None, tree._full_check((m, h.x), g))
            assert tree._replay((m, h.x), g) is REPLAYED  # remembered: m's own dicts now
        del m
    h.step()


def test_replay_hands_over_the_current_parameters():
    h = Harness()
    new = torch.nn.Parameter(torch.full((4,), 9.0))
    h.mod.a.scale = new
    h.step()  # full path: the new parameter, remembered
    h.step()  # replay: the exported value must be the new parameter, not the old one
    with torch.no_grad():
        assert _tree()._replay((h.mod, h.x), Net.forward.__globals__) is REPLAYED
    with torch.no_grad():
        new.fill_(-4.0)
    h.step()


def test_shape_guards_replay_as_the_full_path():
    def f(x, y, n):
        return (x @ y) * n + x.shape[0] // 2

    fd, tc = CountingBackend(), CountingBackend()
    opt = ferrodyn.compile(f, backend=fd, dynamic=True)
    ref = torch.compile(f, backend=tc, dynamic=True)
    first = (torch.randn(4, 3), torch.randn(3, 5), 2)
    torch.testing.assert_close(opt(*first), f(*first))
    torch.testing.assert_close(ref(*first), f(*first))
    (entry,) = _C.cache_entries(f.__code__)
    tree = entry.guards
    assert tree.replayable
    decided = set()
    cases = [(torch.randn(a, b), torch.randn(c, d), n)
             for a, b, c, d, n in [(6, 3, 3, 7, 2), (6, 4, 4, 2, 5), (1, 3, 3, 5, 2), (6, 3, 2, 5, 2),
                                   (4, 3, 3, 1, 2), (2, 2, 2, 2, 3)]]
    cases.append((torch.randn(3, 6).t(), torch.randn(3, 5), 2))  # other strides
    cases.append((torch.randn(4, 3), torch.randn(3, 5), 2.5))  # a float where an int was
    for args in cases:
        r = tree._replay(args)
        assert r in (None, tree._full_check(args))
        decided.add(r)
        if args[0].shape[1] == args[1].shape[0]:
            torch.testing.assert_close(opt(*args), f(*args))
            torch.testing.assert_close(ref(*args), f(*args))
    assert {True, False} <= decided
    assert fd.count == tc.count


def test_shape_guards_over_many_symbols_replay_as_the_full_path():
    # Three 3-d tensors: 18 size/stride symbols in one leaf, each tensor's dims read once.
    def f(q, k, v, n):
        return (q @ k.transpose(-1, -2)).softmax(-1) @ v * n

    fd, tc = CountingBackend(), CountingBackend()
    opt = ferrodyn.compile(f, backend=fd, dynamic=True)
    ref = torch.compile(f, backend=tc, dynamic=True)

    def inputs(b, m, length, d, n=2, lv=None):
        return (torch.randn(b, m, d), torch.randn(b, length, d),
                torch.randn(b, length if lv is None else lv, d), n)

    first = inputs(2, 1, 5, 8)
    torch.testing.assert_close(opt(*first), f(*first))
    torch.testing.assert_close(ref(*first), f(*first))
    (entry,) = _C.cache_entries(f.__code__)
    tree = entry.guards
    assert tree.replayable
    cases = [inputs(2, 1, 9, 8), inputs(3, 1, 4, 6, n=5), inputs(2, 3, 9, 8), inputs(1, 1, 9, 8),
             inputs(2, 1, 9, 8, lv=7), inputs(2, 1, 1, 8), inputs(2, 1, 9, 8, n=2.5)]
    q, k, v, n = inputs(2, 1, 9, 8)
    cases.append((q, k, torch.randn(8, 9, 2).permute(2, 1, 0), n))  # other strides
    cases.append((q, torch.randn(2, 8, 9).transpose(1, 2), v, n))
    decided = set()
    for args in cases:
        r = tree._replay(args)
        assert r in (None, tree._full_check(args))
        decided.add(r)
        if args[1].shape[1] == args[2].shape[1]:
            torch.testing.assert_close(opt(*args), f(*args))
            torch.testing.assert_close(ref(*args), f(*args))
    assert {True, False} <= decided
    assert fd.count == tc.count


def test_dict_version_tags_move_with_every_mutation():
    d = {}
    seen = {_C._dict_version(d)}
    if REPLAYED is None:  # 3.13: versions are not read, so nothing is ever replayed from them
        assert seen == {None} and sys.version_info >= (3, 13)
        return
    for mutate in (lambda: d.__setitem__("a", 1), lambda: d.__setitem__("a", 2),
                   lambda: d.update(b=3), lambda: d.pop("a"), lambda: d.setdefault("c", 4),
                   d.clear):
        mutate()
        v = _C._dict_version(d)
        assert v not in seen
        seen.add(v)
    assert _C._dict_version({}) not in seen  # a new dict: a new version

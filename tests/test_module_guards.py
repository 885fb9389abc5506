"""A compiled module's parameters and buffers reach its graph through the guard tree (exported
graph inputs, read once per call by the guards): every way of changing the module between calls
gives the eager result — reassigning or deleting a parameter, registering a buffer, swapping a
submodule, `load_state_dict` in place (which keeps hitting the same entry), in-place parameter
updates — with graph counts compared with torch.compile's."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import ferrodyn
from ferrodyn import _C
from counting_backend import CountingBackend


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

    def forward(self, x):
        y = self.lin(x) * self.scale + self.shift
        extra = getattr(self, "extra", None)
        if extra is not None:
            y = y + extra
        return y


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block()
        self.b = Block()

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _pair():
    torch.manual_seed(0)
    mod = Net()
    fd_be, tc_be = CountingBackend(), CountingBackend()
    return mod, ferrodyn.compile(mod, backend=fd_be), torch.compile(mod, backend=tc_be), fd_be, tc_be


def _check(mod, opt, ref, x):
    with torch.no_grad():
        expected = mod(x)
        assert torch.allclose(opt(x), expected)
        assert torch.allclose(ref(x), expected)


def _entries():
    return _C.cache_entries(Net.forward.__code__)


def test_parameters_reach_the_graph_through_the_guard_tree():
    mod, opt, ref, fd_be, _ = _pair()
    x = torch.randn(3, 4)
    _check(mod, opt, ref, x)
    (entry,) = _entries()
    assert "__ferrodyn_x" in getattr(entry.fn, "__ferrodyn_source__", "")
    _check(mod, opt, ref, x)
    assert entry.hits >= 1 and fd_be.count == 1


def test_reassigned_parameter_is_used():
    mod, opt, ref, fd_be, tc_be = _pair()
    x = torch.randn(3, 4)
    _check(mod, opt, ref, x)
    mod.a.scale = torch.nn.Parameter(torch.full((4,), 3.0))
    _check(mod, opt, ref, x)
    mod.b.lin.weight = torch.nn.Parameter(torch.randn(4, 4))
    _check(mod, opt, ref, x)
    assert fd_be.count == tc_be.count


def test_in_place_update_and_load_state_dict_keep_hitting():
    mod, opt, ref, fd_be, tc_be = _pair()
    x = torch.randn(3, 4)
    _check(mod, opt, ref, x)
    hits = _entries()[0].hits
    with torch.no_grad():
        mod.a.lin.weight.mul_(2)
    _check(mod, opt, ref, x)
    other = Net()
    mod.load_state_dict(other.state_dict())
    _check(mod, opt, ref, x)
    assert len(_entries()) == 1 and _entries()[0].hits == hits + 2
    assert fd_be.count == tc_be.count == 1


def test_deleted_parameter_and_new_attribute():
    mod, opt, ref, fd_be, tc_be = _pair()
    x = torch.randn(3, 4)
    _check(mod, opt, ref, x)
    del mod.a.scale
    mod.a.scale = torch.nn.Parameter(torch.full((4,), -1.0))  # now registered again, new object
    _check(mod, opt, ref, x)
    mod.b.extra = torch.nn.Parameter(torch.ones(4))
    _check(mod, opt, ref, x)
    del mod.b.extra
    _check(mod, opt, ref, x)


def test_registered_buffer_and_replaced_buffer():
    mod, opt, ref, fd_be, tc_be = _pair()
    x = torch.randn(3, 4)
    _check(mod, opt, ref, x)
    mod.a.register_buffer("extra", torch.full((4,), 5.0))
    _check(mod, opt, ref, x)
    mod.b.shift = torch.full((4,), 7.0)  # a buffer reassigned: goes to _buffers
    _check(mod, opt, ref, x)
    mod.b.register_buffer("shift", torch.full((4,), -2.0))
    _check(mod, opt, ref, x)


def test_swapped_submodule():
    mod, opt, ref, fd_be, tc_be = _pair()
    x = torch.randn(3, 4)
    _check(mod, opt, ref, x)
    mod.a = Block()
    _check(mod, opt, ref, x)
    mod.b.lin = torch.nn.Linear(4, 4, bias=False)
    _check(mod, opt, ref, x)
    mod.a.lin = torch.nn.Identity()
    _check(mod, opt, ref, x)


def test_parameter_with_another_shape_recompiles():
    mod, opt, ref, fd_be, tc_be = _pair()
    x = torch.randn(3, 4)
    _check(mod, opt, ref, x)
    with torch.no_grad():
        mod.a.scale.data = torch.full((1,), 2.0)  # same object, new shape (broadcasts)
    _check(mod, opt, ref, x)
    assert fd_be.count == 2

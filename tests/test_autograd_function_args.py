"""`Cls.apply` with dict arguments (variables/autograd_function.py): a config dict keyed by
constants (transformers' yoso passes `self.lsh_config`) is captured in the one apply node; its
items are guarded (a changed value recompiles), forward sees an equal dict, and a forward that
mutates it is refused (the graph breaks at the call; eager's mutation happens). Results and
gradients are eager's; graph counts at most torch.compile's."""

import math

import pytest
import torch
from torch import nn

import ferrodyn
from counting_backend import CountingBackend
from test_autograd_function import _captured, _run, _x

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Cumulation(torch.autograd.Function):
    """A config dict read in forward and, through ctx, in backward (yoso's shape)."""

    @staticmethod
    def forward(ctx, q, k, v, config):
        p = config["power"]
        e = (1 - torch.acos(torch.matmul(q, k.transpose(-1, -2)).clamp(-0.99, 0.99))
             / math.pi) ** p
        ctx.save_for_backward(e, q, k, v)
        ctx.config = config
        return torch.matmul(e, v)

    @staticmethod
    def backward(ctx, g):
        e, q, k, v = ctx.saved_tensors
        p = ctx.config["power"]
        w = torch.matmul(g, v.transpose(-1, -2)) * e
        return (torch.matmul(w, (p / 2) * k), torch.matmul(w.transpose(-1, -2), (p / 2) * q),
                torch.matmul(e.transpose(-1, -2), g), None)


class DictOfTensors(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, extra):
        ctx.scale = extra["scale"]
        return x * extra["scale"] + extra["shift"]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


class GrowsDict(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, config):
        config["calls"] = config.get("calls", 0) + 1
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class Attention(nn.Module):
    def __init__(self, power):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.config = {"power": power, "name": "lsh", "dims": (8, 8)}

    def forward(self, x):
        q = nn.functional.normalize(self.q(x), dim=-1)
        k = nn.functional.normalize(self.k(x), dim=-1)
        return Cumulation.apply(q, k, self.v(x), self.config) + x


def test_config_dict_of_a_module_is_captured():
    torch.manual_seed(0)
    net = Attention(power=4)
    ours, theirs = _run(net, _x(2, 5, 8))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, Cumulation)


def test_changed_dict_value_recompiles():
    torch.manual_seed(0)
    net = Attention(power=4)
    backend = CountingBackend()
    compiled = ferrodyn.compile(net, backend=backend)
    x, = _x(2, 5, 8)()
    first = compiled(x)
    torch.testing.assert_close(first, net(x))
    net.config["power"] = 2
    second = compiled(x)
    torch.testing.assert_close(second, net(x))
    assert not torch.allclose(first, second)
    assert backend.count == 2  # the guard on the item failed: a second graph


def test_dict_made_in_the_frame_with_tensor_values():
    def fn(x, shift):
        return DictOfTensors.apply(x, {"scale": 3.0, "shift": shift.cos()}) + 1

    def make():
        torch.manual_seed(2)
        return torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)

    ours, theirs = _run(fn, make)
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, DictOfTensors)


def test_forward_mutating_its_dict_breaks():
    def fn(x, config):
        return GrowsDict.apply(x * 1, config) + 1

    backend = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=backend)
    x, = _x(3)()
    want_config, got_config = {"calls": 5}, {"calls": 5}
    want = fn(x, want_config)
    got = compiled(x, got_config)
    torch.testing.assert_close(got, want)
    assert got_config == want_config
    assert not _captured(backend, GrowsDict)  # refused: torch.compile replays the mutation
    assert backend.count == 3  # (one graph); here: before apply, its forward, after apply

"""nn.Module subclasses made outside torch.nn and created inside traced code
(transformers' `ACT2FN["silu"]` builds a `SiLUActivation`, a subclass defining only
`forward`): built at trace time when only torch.nn's code runs while building it
(variables/nn_construct.py); a subclass with its own `__init__`, attribute hook or data
descriptor still breaks the graph. Compared with eager and with torch.compile's graph
count."""

import pytest
import torch
from torch import nn

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class SiLUAct(nn.Module):
    def forward(self, x):
        return nn.functional.silu(x)


class ScaledReLU(nn.ReLU):
    scale = 3.0

    def forward(self, x):
        return super().forward(x) * self.scale


class OwnInit(nn.Module):
    made = 0

    def __init__(self):
        super().__init__()
        type(self).made += 1

    def forward(self, x):
        return x + 1


class Helper(nn.ReLU):  # torch's __init__ is not Module's: a method of its own is refused
    def helper(self):
        return 2

    def forward(self, x):
        return super().forward(x) * self.helper()


def make_and_call(x):
    return SiLUAct()(x) + ScaledReLU()(x - 1)


def own_init(x):
    return OwnInit()(x) * 2


def helper_method(x):
    return Helper()(x)


def _counts(fn, x):
    fd = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=fd)
    want = fn(x)
    assert torch.allclose(compiled(x), want) and torch.allclose(compiled(x), want)
    torch._dynamo.reset()
    tc = CountingBackend()
    assert torch.allclose(torch.compile(fn, backend=tc)(x), want)
    return fd.count, tc.count


def test_subclass_with_forward_only_in_one_graph():
    fd, tc = _counts(make_and_call, torch.randn(6))
    assert fd == 1 and fd <= tc, (fd, tc)


def test_own_init_runs_once_per_call():
    x = torch.randn(4)
    before = OwnInit.made
    fd, tc = _counts(own_init, x)
    # eager, two compiled calls and torch.compile's call each built one: the traced code
    # never ran the user's __init__ a second time
    assert OwnInit.made - before == 4
    assert fd >= 1 and tc >= 1


def test_subclass_with_methods_of_its_own_is_not_built_at_trace_time():
    x = torch.randn(5)
    _counts(helper_method, x)
    torch._dynamo.reset()
    reasons = [str(r) for r in ferrodyn.explain(helper_method)(x).break_reasons]
    assert any("creating a Helper" in r for r in reasons), reasons

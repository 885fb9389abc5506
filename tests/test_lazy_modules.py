"""Lazy modules (`LazyLinear`, `LazyBatchNorm*`, user `LazyModuleMixin` modules) called before
their parameters exist: ferrodyn runs the initialization hook for real at trace time and traces
again (variables/lazy_modules.py), or, for the compiled module itself, runs the hook uncaptured
before its forward (optimized_module.py). Each case compares the result and the module's state
(class, parameters) with eager on an identically seeded module, and the graph count with
torch.compile's over the same calls. Before: the frame ran eagerly ("uninitialized parameter")
or broke into extra graphs at `initialize_parameters`."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch.nn.modules.lazy import LazyModuleMixin

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class LazyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.LazyLinear(6)
        self.fc2 = torch.nn.LazyLinear(3)  # its input is computed in the graph

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class ListSum(LazyModuleMixin, torch.nn.Module):
    """A user lazy layer: initialize_parameters reads its (list) input's shape."""

    def initialize_parameters(self, xs):
        with torch.no_grad():
            self.w = torch.nn.Parameter(torch.empty(xs[0].shape[-1]).fill_(0.5))

    def forward(self, xs):
        out = 0
        for x in xs:
            out = out + x
        return out * self.w


class MeanListSum(ListSum):
    """initialize_parameters reads its input's values."""

    def initialize_parameters(self, xs):
        with torch.no_grad():
            self.w = torch.nn.Parameter(xs[0].mean(0).clone())


class HoldsListSum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = ListSum()

    def forward(self, xs):
        return self.layer(xs[:-1])


class MakesSub(LazyModuleMixin, torch.nn.Module):
    """A lazy module whose initialization creates a lazy submodule (called with a keyword)."""

    def initialize_parameters(self, *args, **kwargs):
        self.layer = ListSum()

    def forward(self, xs, scale):
        return self.layer(xs) * scale


class Materialized(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_parameter("param", None)

    def forward(self, x):
        return x * self.param.sum()


class BecomesMaterialized(LazyModuleMixin, Materialized):
    cls_to_become = Materialized

    def __init__(self):
        super().__init__()
        self.param = torch.nn.UninitializedParameter()

    def initialize_parameters(self, x):
        self.param.materialize(x.shape)
        torch.nn.init.uniform_(self.param)


def _state(m):
    return type(m).__name__, {k: v.detach().clone() for k, v in m.state_dict().items()}


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.allclose(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _run(make, call, compile_):
    torch.manual_seed(0)
    m = make()
    torch.manual_seed(1)
    outs = call(compile_, m)
    return outs, _state(m)


def _check(make, call):
    """eager vs ferrodyn vs torch.compile: values and state equal eager's; graph counts equal."""
    ref = _run(make, call, lambda f: f)
    tb = CountingBackend()
    torch._dynamo.reset()
    _run(make, call, lambda f: torch.compile(f, backend=tb))
    torch._dynamo.reset()
    fb = CountingBackend()
    got = _run(make, call, lambda f: ferrodyn.compile(f, backend=fb))
    assert _same(ref, got)
    return fb.count, tb.count


def test_torch_lazy_layers_nested_one_graph():
    def call(C, m):
        f = C(m)
        x = torch.randn(4, 5)
        return [f(x), f(x), f(torch.randn(4, 5))]
    fd, tc = _check(LazyMLP, call)
    assert fd == tc == 1


def test_lazy_batchnorm_global_called_from_function():
    def call(C, m):
        def fn(x):
            return m(x) + 1
        f = C(fn)
        x = torch.randn(4, 3, 5)
        return [f(x), f(x)]
    fd, tc = _check(lambda: torch.nn.LazyBatchNorm1d(), call)
    assert fd == tc == 1


def test_user_lazy_layer_reads_frame_inputs():
    def call(C, m):
        f = C(m)
        xs = [torch.randn(3, 4), torch.randn(3, 4), None]
        return [f(xs), f(xs)]
    fd, tc = _check(HoldsListSum, call)
    assert fd == tc == 1


def test_compiled_module_is_lazy_and_makes_lazy_submodule():
    def call(C, m):
        f = C(m)
        xs = [torch.randn(3, 4), torch.randn(3, 4)]
        return [f(xs, scale=2.0), f(xs, scale=2.0), type(m.layer).__name__]
    fd, tc = _check(MakesSub, call)
    assert fd == tc == 1


def test_cls_to_become_and_random_init_module_attribute():
    def call(C, m):
        holder = torch.nn.Sequential(m)
        f = C(holder)
        x = torch.randn(2, 3)
        return [f(x), f(x), type(holder[0]).__name__]
    fd, tc = _check(BecomesMaterialized, call)
    assert fd == tc == 1


def test_user_lazy_layer_reading_input_values():
    """A frame input's real value is handed to initialize_parameters (torch.compile hands it a
    fake tensor, which then becomes the parameter: it raises here)."""
    class Holder(HoldsListSum):
        def __init__(self):
            super().__init__()
            self.layer = MeanListSum()

    def call(C, m):
        f = C(m)
        xs = [torch.randn(3, 4), torch.randn(3, 4), None]
        return [f(xs), f(xs)]
    ref = _run(Holder, call, lambda f: f)
    fb = CountingBackend()
    got = _run(Holder, call, lambda f: ferrodyn.compile(f, backend=fb))
    assert _same(ref, got)
    assert fb.count == 1
    torch._dynamo.reset()
    with pytest.raises(Exception):
        _run(Holder, call, lambda f: torch.compile(f, backend=CountingBackend()))
    torch._dynamo.reset()


def test_user_lazy_layer_given_a_computed_tensor_is_refused():
    """MeanListSum's initialize_parameters reads the values of its input; a tensor computed in
    the graph has only a fake value at trace time, so the call breaks the graph (eager values;
    torch.compile raises here, see above)."""
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = MeanListSum()

        def forward(self, x):
            return self.layer([x * 2, x + 1])

    def call(C, m):
        f = C(m)
        x = torch.randn(3, 4)
        return [f(x), f(x)]
    ref = _run(Holder, call, lambda f: f)
    fb = CountingBackend()
    got = _run(Holder, call, lambda f: ferrodyn.compile(f, backend=fb))
    assert _same(ref, got)
    # the graph before the lazy call, initialize_parameters (its own frame), the graph after
    assert fb.count == 3


def test_initialization_after_a_random_op_is_refused():
    """Eager draws the initial weights after the graph's randn: the init is not run at trace
    time (it would draw first), so weights and result equal eager's."""
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.LazyLinear(4)

        def forward(self, x):
            return self.fc(x + torch.randn(x.shape))

    def call(C, m):
        f = C(m)
        x = torch.randn(2, 3)
        return [f(x)]
    ref = _run(Noisy, call, lambda f: f)
    fb = CountingBackend()
    got = _run(Noisy, call, lambda f: ferrodyn.compile(f, backend=fb))
    assert _same(ref, got)
    assert fb.count >= 1

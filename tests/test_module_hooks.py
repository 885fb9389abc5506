"""nn.Module forward hooks on modules called from traced code (variables/module_hooks.py): each
case builds the same model three times (hooks close over per-build state), runs it eagerly,
through `ferrodyn.compile` and through `torch.compile` on the same inputs, and compares results
and the state the hooks mutate (lists, dicts, module attributes) with eager's; graph counts are
compared with torch.compile's (CountingBackend for both)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch._dynamo
from torch import nn

import ferrodyn
from compiled_vs_eager import same
from counting_backend import CountingBackend


@pytest.fixture(autouse=True)
def _fresh(fresh_ferrodyn):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _inputs(n_calls=2, shape=(3, 4)):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(*shape, generator=g),) for _ in range(n_calls)]


def differential(make, calls):
    """`make()` -> (callable, state()): eager, ferrodyn and torch.compile each get a fresh build;
    results and state after every call must be eager's. Returns ((graphs after the first call,
    after all calls) of ferrodyn, the same of torch.compile)."""
    torch.manual_seed(0)
    fn, state = make()
    want = []
    for args in calls:
        want.append((fn(*args), state()))
    counts = []
    for compile_ in (ferrodyn.compile, torch.compile):
        torch.manual_seed(0)
        fn, state = make()
        backend = CountingBackend()
        compiled = compile_(fn, backend=backend)
        first = None
        for args, (w_out, w_state) in zip(calls, want):
            out = compiled(*args)
            assert same(out, w_out), (compile_.__module__, out, w_out)
            assert same(state(), w_state), (compile_.__module__, state(), w_state)
            first = backend.count if first is None else first
        counts.append((first, backend.count))
    return tuple(counts)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.body(x) * 2)


def _outer(model):
    """A function that calls the model (the hooked modules are inside the traced frame)."""
    def run(x):
        return model(x).sin() + 1
    return run


# -- cases: make() -> (fn, state) --------------------------------------------------------------

def _hook_appends_output():
    model, seen = Net(), []
    model.body[1].register_forward_hook(lambda m, args, out: seen.append(out * 1))
    return _outer(model), lambda: list(seen)


def _hook_replaces_output():
    model = Net()
    model.body.register_forward_hook(lambda m, args, out: out + 10)
    model.head.register_forward_hook(lambda m, args, out: None)
    return _outer(model), lambda: None


def _pre_hook_returns_tensor():
    model = Net()
    model.head.register_forward_pre_hook(lambda m, args: args[0] * 3)  # wrapped in a 1-tuple
    return _outer(model), lambda: None


def _pre_hook_returns_tuple():
    model = Net()
    model.body[0].register_forward_pre_hook(lambda m, args: (args[0].cos(),))
    model.body[2].register_forward_pre_hook(lambda m, args: None)
    return _outer(model), lambda: None


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=1.0, bias=None):
        y = self.lin(x) * scale
        return y if bias is None else y + bias


def _kwargs_pre_hook():
    inner, log = Scaled(), []

    def pre(m, args, kwargs):
        log.append(sorted(kwargs))
        return (args[0] + 1,), {**kwargs, "scale": 4.0}
    inner.register_forward_pre_hook(pre, with_kwargs=True)

    def run(x):
        return inner(x, scale=2.0, bias=x) + inner(x)
    return run, lambda: list(log)


def _kwargs_forward_hook():
    inner, log = Scaled(), {}

    def post(m, args, kwargs, out):
        log["scale"] = kwargs.get("scale")
        return out - kwargs.get("scale", 0.0)
    inner.register_forward_hook(post, with_kwargs=True)

    def run(x):
        return inner(x, scale=3.0)
    return run, lambda: dict(log)


def _prepend_and_always_call():
    model, order = Net(), []
    model.head.register_forward_hook(lambda m, a, out: (order.append("a"), out * 2)[1])
    model.head.register_forward_hook(lambda m, a, out: (order.append("b"), out + 1)[1],
                                     prepend=True)
    model.head.register_forward_hook(lambda m, a, out: order.append("c"), always_call=True)
    model.head.register_forward_pre_hook(lambda m, a: order.append("p1"))
    model.head.register_forward_pre_hook(lambda m, a: order.append("p0"), prepend=True)
    return _outer(model), lambda: list(order)


class Saver:
    def __init__(self):
        self.outputs = {}

    def save(self, name, module, args, out):
        self.outputs[name] = out.detach()

    def __call__(self, module, args, out):
        self.outputs["called"] = out.sum()


def _bound_method_partial_and_callable_hooks():
    model, saver = Net(), Saver()
    model.body[0].register_forward_hook(functools.partial(saver.save, "first"))
    model.body[2].register_forward_hook(saver)
    model.head.register_forward_hook(functools.partial(Saver.save, saver, "head"))
    return _outer(model), lambda: dict(saver.outputs)


def _hook_stores_on_module():
    model = Net()

    def keep(m, args, out):
        m.last_out = out.detach()
        m.calls = getattr(m, "calls", 0) + 1
    model.body[2].register_forward_hook(keep)

    def state():
        m = model.body[2]
        return getattr(m, "last_out", None), getattr(m, "calls", 0)
    return _outer(model), state


def _module_called_twice():
    lin, seen = nn.Linear(4, 4), []
    lin.register_forward_hook(lambda m, a, out: seen.append(a[0].shape[0]) or out.relu())

    def run(x):
        return lin(lin(x))
    return run, lambda: list(seen)


CASES = {
    "hook_appends_output": _hook_appends_output,
    "hook_replaces_output": _hook_replaces_output,
    "pre_hook_returns_tensor": _pre_hook_returns_tensor,
    "pre_hook_returns_tuple": _pre_hook_returns_tuple,
    "kwargs_pre_hook": _kwargs_pre_hook,
    "kwargs_forward_hook": _kwargs_forward_hook,
    "prepend_and_always_call": _prepend_and_always_call,
    "bound_method_partial_and_callable_hooks": _bound_method_partial_and_callable_hooks,
    "hook_stores_on_module": _hook_stores_on_module,
    "module_called_twice": _module_called_twice,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_hooks_traced_like_eager(name):
    fd, tc = differential(CASES[name], _inputs())
    assert fd == tc and fd[0] == 1, (fd, tc)


def test_feature_tap_in_sequential_is_one_graph_at_the_module_entry():
    """`ferrodyn.compile(model)` of a model whose submodules (one inside a Sequential) carry
    feature-extraction hooks: one graph, like torch.compile."""
    def make():
        model, feats = Net(), {}

        def tap(name):
            def hook(m, args, out):
                feats[name] = out * 1
            return hook
        model.body[1].register_forward_hook(tap("relu"))
        model.body.register_forward_hook(tap("body"))
        return model, lambda: dict(feats)
    fd, tc = differential(make, _inputs())
    assert fd == tc and fd[0] == 1, (fd, tc)

"""Optimizer steps and training loops compiled with ferrodyn.compile: parameters, `.grad` and
optimizer state (momentum buffers, exp_avg, exp_avg_sq, step counters) after several steps are
eager's bit for bit, and ferrodyn makes no more graphs than torch.compile.

- A hand-written step reading `p.grad` (tensor.py `_INPUT_ATTRS`) is one graph: `.grad` of a
  graph input is an input of its own, guarded (None stays None).
- `torch.optim` steps (SGD with momentum, Adam, AdamW; foreach on and off) run eagerly: the
  step breaks at the call (`torch.optim` is torch code, not traced), so values are eager's.
  torch.compile captures them (TorchDynamo's OptimizerVariable) but computes Adam's bias
  corrections in float32 tensors (`_get_value` returns the tensor while compiling) where eager
  uses Python floats: its Adam parameters differ from eager's in the last bits, ferrodyn's do not.
- `torch.autograd.profiler.record_function` regions are ignored (profiler_ctx.py), as torch does.
"""

import copy

import pytest
import torch

import ferrodyn
from compiled_vs_eager import same
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(5, 4, generator=g) for _ in range(n)]


def _state(opt):
    return [{k: v for k, v in opt.state[p].items()} for g in opt.param_groups for p in g["params"]]


OPTIMIZERS = {
    "sgd_momentum": lambda p, fe: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=fe),
    "adam": lambda p, fe: torch.optim.Adam(p, lr=0.01, foreach=fe),
    "adamw": lambda p, fe: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=fe),
}


def _run_steps(make_opt, foreach, compiler, steps=3):
    model = _model()
    opt = make_opt(model.parameters(), foreach)

    def step():
        opt.step()
    fn = compiler(step) if compiler else step
    for x in _batches(steps):
        opt.zero_grad()
        model(x).sum().backward()
        fn()
    return model, opt


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_optimizer_step_matches_eager(name, foreach):
    torch._dynamo.reset()
    want_model, want_opt = _run_steps(OPTIMIZERS[name], foreach, None)
    fd, tc = CountingBackend(), CountingBackend()
    got_model, got_opt = _run_steps(OPTIMIZERS[name], foreach,
                                    lambda f: ferrodyn.compile(f, backend=fd))
    _run_steps(OPTIMIZERS[name], foreach, lambda f: torch.compile(f, backend=tc))
    torch._dynamo.reset()
    for a, b in zip(want_model.parameters(), got_model.parameters()):
        assert same(a, b) and same(a.grad, b.grad)
    assert same(_state(want_opt), _state(got_opt))
    assert fd.count <= tc.count, (fd.count, tc.count)


def test_training_loop_with_optimizer_matches_eager():
    """forward, backward, step and zero_grad in one compiled function: the forward is a graph,
    the rest runs eagerly after the break; values are eager's."""
    def make():
        model = _model()
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def loop(compiler):
        model, opt = make()

        def train_step(x):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        fn = compiler(train_step) if compiler else train_step
        return [fn(x) for x in _batches(4)], model, opt
    torch._dynamo.reset()
    want = loop(None)
    fd, tc = CountingBackend(), CountingBackend()
    got = loop(lambda f: ferrodyn.compile(f, backend=fd))
    loop(lambda f: torch.compile(f, backend=tc))
    torch._dynamo.reset()
    assert same(want[0], got[0])
    for a, b in zip(want[1].parameters(), got[1].parameters()):
        assert same(a, b)
    assert same(_state(want[2]), _state(got[2]))
    assert 1 <= fd.count <= tc.count, (fd.count, tc.count)


def sgd_by_hand(params, lr):
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad.mul_(0.5)


def test_hand_written_step_reading_grad_is_one_graph():
    def loop(compiler):
        model = _model()
        fn = compiler(sgd_by_hand) if compiler else sgd_by_hand
        for x in _batches(3):
            model(x).sum().backward()
            fn(list(model.parameters()), 0.1)
        return model
    torch._dynamo.reset()
    want = loop(None)
    fd, tc = CountingBackend(), CountingBackend()
    got = loop(lambda f: ferrodyn.compile(f, backend=fd))
    loop(lambda f: torch.compile(f, backend=tc))
    torch._dynamo.reset()
    for a, b in zip(want.parameters(), got.parameters()):
        assert same(a, b) and same(a.grad, b.grad)
    assert fd.count == 1 and fd.count <= tc.count, (fd.count, tc.count)


def test_grad_none_is_guarded():
    """A graph made while `.grad` was None must not run once it is a tensor (and back)."""
    def f(p):
        if p.grad is None:
            return p * 2
        return p + p.grad
    fd = CountingBackend()
    g = ferrodyn.compile(f, backend=fd)
    p = torch.nn.Parameter(torch.ones(3))
    assert same(g(p), f(p))
    p.grad = torch.full((3,), 5.0)
    assert same(g(p), f(p))
    p.grad = torch.full((3,), 7.0)  # another tensor object, same metadata: the same graph
    assert same(g(p), f(p))
    p.grad = None
    assert same(g(p), f(p))
    assert fd.count == 2


def test_grad_identity_and_aliasing():
    """`.grad` aliasing another input: an in-place op through one name is seen through the
    other, and a later call where they are distinct tensors does not reuse that graph."""
    def f(p, g):
        g.add_(1)
        return p.grad is g, p.grad * 2

    def make(alias):
        p = torch.nn.Parameter(torch.ones(3))
        p.grad = torch.arange(3.0)
        return p, (p.grad if alias else torch.arange(3.0))
    fd = CountingBackend()
    compiled = ferrodyn.compile(f, backend=fd)
    for alias in (True, False, True):
        want, got = f(*make(alias)), compiled(*make(alias))
        assert same(want, got), (alias, want, got)
    assert fd.count == 2


def test_grad_of_a_tensor_made_in_the_trace_is_refused():
    def f(x):
        y = x * 2
        return y.grad, y
    x = torch.ones(2, requires_grad=True)
    fd = CountingBackend()
    want, got = f(x), ferrodyn.compile(f, backend=fd)(x)
    assert got[0] is None and want[0] is None and same(want[1], got[1])


def test_profiler_record_function_is_ignored():
    def f(x):
        with torch.autograd.profiler.record_function("region"):
            y = x.sin() * 2
        return y + 1
    x = torch.randn(4)
    fd, tc = CountingBackend(), CountingBackend()
    assert same(ferrodyn.compile(f, backend=fd)(x), f(x))
    torch._dynamo.reset()
    torch.compile(f, backend=tc)(x)
    torch._dynamo.reset()
    assert fd.count == 1 and tc.count == 1

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


def differential(make, calls, torch_matches_eager=True):
    """`make()` -> (callable, state()): eager, ferrodyn and torch.compile each get a fresh build;
    results and state after every call must be eager's. Returns ((graphs after the first call,
    after all calls) of ferrodyn, the same of torch.compile). `torch_matches_eager=False`:
    torch.compile's results are not compared (where it differs from eager, said at the call)."""
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
            if compile_ is ferrodyn.compile or torch_matches_eager:
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


def _pre_hook_mutates_input_in_place():
    model = Net()

    def shift(m, args):
        args[0].sub_(0.5)  # the ReLU output, in place
        return args
    model.body[2].register_forward_pre_hook(shift)
    return _outer(model), lambda: None


def _hooks_with_default_arg_closures():
    model, seen = Net(), {"a": [], "b": []}
    for key, sub in (("a", model.body[0]), ("b", model.head)):
        sub.register_forward_pre_hook(lambda m, args, key=key: seen[key].append(args[0] * 1))
    return _outer(model), lambda: {k: list(v) for k, v in seen.items()}


class HookState:
    def __init__(self):
        self.value = None


def _hooks_sharing_a_state_object():
    """An encoder hook publishes its output; a decoder pre-hook adds it when set."""
    model, state = Net(), HookState()

    def publish(m, args, out):
        state.value = out.detach()

    def consume(m, args):
        if state.value is None:
            return None
        return (args[0] + state.value,)
    model.body[0].register_forward_hook(publish)
    model.body[2].register_forward_pre_hook(consume)
    return _outer(model), lambda: state.value


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y, y.mean(0)


def _hook_on_a_tuple_output():
    inner = Pair()
    inner.register_forward_hook(lambda m, args, out: (out[0] * 2,) + tuple(out[1:]))
    inner.register_forward_hook(
        lambda m, args, kwargs, out: None if kwargs else out[::-1], with_kwargs=True)

    def run(x):
        a, b = inner(x)
        return a.sum(0) + b
    return run, lambda: None


CASES = {
    "pre_hook_mutates_input_in_place": _pre_hook_mutates_input_in_place,
    "hooks_with_default_arg_closures": _hooks_with_default_arg_closures,
    "hooks_sharing_a_state_object": _hooks_sharing_a_state_object,
    "hook_on_a_tuple_output": _hook_on_a_tuple_output,
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


# -- hook users in torch: weight_norm / spectral_norm (old-style, forward pre-hooks) -------------

def _weight_norm():
    lin = nn.utils.weight_norm(nn.Linear(4, 4))
    return _outer(lin), lambda: getattr(lin, "weight").detach().clone()


def _spectral_norm(train):
    def make():
        lin = nn.utils.spectral_norm(nn.Linear(4, 4)).train(train)
        # power iteration updates the u/v buffers in place (train only)
        return _outer(lin), lambda: {k: v.clone() for k, v in lin.state_dict().items()}
    return make


@pytest.mark.parametrize("make", [_weight_norm, _spectral_norm(True), _spectral_norm(False)],
                         ids=["weight_norm", "spectral_norm_train", "spectral_norm_eval"])
def test_weight_norm_style_pre_hooks(make):
    fd, tc = differential(make, _inputs(3))
    assert fd == tc and fd[0] == 1, (fd, tc)


# -- global hooks (torch.nn.modules.module.register_module_forward_*) ----------------------------

@pytest.fixture
def global_hooks():
    handles = []
    yield handles.append
    for h in handles:
        h.remove()


def test_global_forward_and_pre_hooks(global_hooks):
    from torch.nn.modules import module as mm
    seen = []
    global_hooks(mm.register_module_forward_pre_hook(lambda m, args: (args[0] + 1,)))
    global_hooks(mm.register_module_forward_hook(
        lambda m, args, out: seen.append(type(m).__name__) or out * 2))
    global_hooks(mm.register_module_forward_hook(lambda m, args, out: None, always_call=True))

    def make():
        seen.clear()
        model = Net()
        model.head.register_forward_hook(lambda m, args, out: out - 1)  # after the global ones
        return _outer(model), lambda: list(seen)
    fd, tc = differential(make, _inputs())
    assert fd == tc and fd[0] == 1, (fd, tc)


# -- guards: hooks added, removed or replaced after the first call -------------------------------

def _scale_hook(k):
    def hook(m, args, out):
        return out * k
    return hook


@pytest.mark.parametrize("change", ["add", "remove", "replace_in_dict", "add_global", "add_pre"])
def test_hook_changes_after_the_first_call_recompile(change):
    """Eager and ferrodyn each get their own model; after one call the hooks change; the
    compiled call gives eager's result (ferrodyn guards the hook dicts and each hook: it
    recompiles). torch.compile is left out: it skips hook guards by default
    (`skip_nnmodule_hook_guards`) and keeps running the first graph."""
    from torch.nn.modules import module as mm
    x = _inputs(1)[0][0]
    results = {}
    for compile_ in (None, ferrodyn.compile):
        torch.manual_seed(0)
        model = Net()
        handle = model.body[0].register_forward_hook(_scale_hook(2))
        backend = CountingBackend()
        fn = _outer(model) if compile_ is None else compile_(_outer(model), backend=backend)
        first = fn(x)
        if change == "add":
            model.body[2].register_forward_hook(_scale_hook(3))
        elif change == "remove":
            handle.remove()
        elif change == "replace_in_dict":
            model.body[0]._forward_hooks[handle.id] = _scale_hook(5)
        elif change == "add_global":
            added = mm.register_module_forward_hook(lambda m, a, out: out + 1)
        else:
            model.head.register_forward_pre_hook(lambda m, args: args[0] * 7)
        try:
            results[compile_] = (first, fn(x), backend.count)
        finally:
            if change == "add_global":
                added.remove()
    (e1, e2, _), (f1, f2, fd_count) = results[None], results[ferrodyn.compile]
    assert same(f1, e1) and same(f2, e2) and not same(e1, e2)
    assert fd_count == 2  # the change recompiled


def test_same_hooks_hit_the_cache():
    model = Net()
    model.body[1].register_forward_hook(_scale_hook(2))
    backend = CountingBackend()
    fn = ferrodyn.compile(_outer(model), backend=backend)
    for (x,) in _inputs(3):
        assert same(fn(x), _outer(model)(x))
    assert backend.count == 1


# -- what stays refused, with eager's values -----------------------------------------------------

def test_full_backward_hooks_run_eagerly_with_eager_gradients():
    """Full backward (pre-)hooks are refused (BackwardHook wraps inputs and outputs in autograd
    nodes); the module call runs eagerly: outputs, gradients and the hooks' calls are eager's."""
    def run(compile_):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model, log = Net(), []
        model.body[0].register_full_backward_hook(lambda m, gi, go: log.append(("post", go[0].sum())))
        model.head.register_full_backward_pre_hook(lambda m, go: log.append(("pre", go[0].sum())))
        backend = CountingBackend()
        fn = _outer(model) if compile_ is None else compile_(_outer(model), backend=backend)
        outs = []
        for (x,) in _inputs(2):
            out = fn(x.requires_grad_())
            out.sum().backward()
            outs.append((out, x.grad))
        return outs, log, [p.grad for p in model.parameters()], backend.count

    want = run(None)
    (fd_out, fd_log, fd_grads, fd), (_, _, _, tc) = run(ferrodyn.compile), run(torch.compile)
    assert same(fd_out, want[0]) and same(fd_log, want[1]) and same(fd_grads, want[2])
    assert fd == tc, (fd, tc)


def test_exception_with_always_call_hook_runs_eagerly():
    """forward raises: eager runs the always_call hook, then re-raises (caught by the caller);
    the traced call refuses, so the hook's effect is eager's. (torch.compile skips always_call
    hooks on an exception while compiling: see `_call_impl`; its log is not compared.)"""
    class Raiser(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    def make():
        m, log = Raiser(), []
        m.register_forward_hook(lambda mod, a, out: log.append("always"), always_call=True)
        m.register_forward_hook(lambda mod, a, out: log.append("plain"))

        def run(x):
            try:
                return m(x)
            except ValueError:
                return x + 1
        return run, lambda: list(log)
    fd, tc = differential(make, _inputs(), torch_matches_eager=False)
    assert fd == (0, 0) and tc == (1, 1), (fd, tc)  # torch.compile's graph skips the hook


def test_hook_registered_inside_traced_code_is_refused():
    def make():
        lin, log = nn.Linear(4, 4), []

        def run(x):
            handle = lin.register_forward_hook(lambda m, a, out: log.append(1) or out * 2)
            y = lin(x)
            handle.remove()
            return y + lin(x)
        return run, lambda: list(log)
    fd, tc = differential(make, _inputs())
    assert fd == tc, (fd, tc)


def test_graph_break_inside_a_hook():
    def make():
        model, log = Net(), []

        def hook(m, args, out):
            log.append(out.sum().item())  # a graph break (data-dependent Python value)
            return out + 1
        model.body[1].register_forward_hook(hook)
        return _outer(model), lambda: list(log)
    fd, tc = differential(make, _inputs())
    assert fd[0] <= tc[0] and fd[1] <= tc[1], (fd, tc)


def test_kwargs_pre_hook_bad_result_raises_like_eager():
    def make():
        lin = Scaled()
        lin.register_forward_pre_hook(lambda m, args, kwargs: args, with_kwargs=True)
        return (lambda x: lin(x, scale=2.0)), lambda: None
    for compile_ in (None, ferrodyn.compile):
        fn, _ = make()
        fn = fn if compile_ is None else compile_(fn, backend=CountingBackend())
        with pytest.raises(RuntimeError, match="forward pre-hook must return None or a tuple"):
            fn(torch.ones(2, 4))


def test_hook_on_the_compiled_module_itself():
    def make():
        model, seen = Net(), []
        model.register_forward_hook(lambda m, a, out: seen.append(out.shape) or out * 3)
        model.register_forward_pre_hook(lambda m, args: (args[0] - 1,))
        return model, lambda: list(seen)
    fd, tc = differential(make, _inputs())
    assert fd == tc, (fd, tc)


def test_backward_hook_added_after_the_first_call_fires():
    """The empty backward-hook dicts are guarded: a full backward hook registered after the
    first call recompiles (the call then runs eagerly) and fires as in eager."""
    def run(compile_):
        torch.manual_seed(0)
        model, log = Net(), []
        backend = CountingBackend()
        fn = _outer(model) if compile_ is None else compile_(_outer(model), backend=backend)
        (x,), (y,) = _inputs()
        fn(x.requires_grad_()).sum().backward()
        model.body[2].register_full_backward_hook(lambda m, gi, go: log.append(go[0] * 1))
        out = fn(y.requires_grad_())
        out.sum().backward()
        return out, log, x.grad, y.grad, backend.count

    want, got = run(None), run(ferrodyn.compile)
    assert same(got[:4], want[:4]) and len(got[1]) == 1
    assert got[4] > 1  # recompiled (torch.compile skips hook guards by default)


_NO_TORCH_GLOBALS = """
def run(x):
    m = make()
    return m(x) + 1
"""


@pytest.mark.parametrize("globals_hold_torch", [True, False])
def test_module_made_in_the_frame_sees_global_hooks_added_later(globals_hold_torch):
    """A module built by the traced code has no Source: the global hook dicts are reached
    through a frame global (`torch`, `torch.nn` or an nn.Module class: here `make`); with
    none, the call is refused (a graph break: `+ 1` is the resumed graph; the module, built
    again by the entry, runs eagerly and its new hook's frame is compiled on its own)."""
    from torch.nn.modules import module as mm
    g = {"make": nn.ReLU} if globals_hold_torch else {"make": lambda: nn.ReLU()}
    exec(_NO_TORCH_GLOBALS, g)
    run = g["run"]
    backend = CountingBackend()
    compiled = ferrodyn.compile(run, backend=backend)
    (x,), = _inputs(1)
    assert same(compiled(x), run(x))
    handle = mm.register_module_forward_hook(lambda m, a, out: out * 0)
    try:
        assert same(compiled(x), run(x)) and same(run(x), torch.ones_like(x))
    finally:
        handle.remove()
    assert backend.count == 2

"""The remembered fast paths of a compiled module's cache hit, and that each falls back when
what it remembered changes:

- `_C.ModuleCall` remembers its "no hooks" verdicts (torch's global hook dicts, the wrapper,
  the original) stamped with dict version tags (`_stamped`); a hook registered after the
  verdict, a replaced hook dict, `forward` or `_compiled_call_impl` set on an instance or a
  class, a `__class__` change, or JIT tracing must each take the full path again.
- The guard tree's module parts (hooks, submodules, parameters) keep deciding exactly after
  the tree has replayed: a replaced submodule or parameter, a hook on a submodule, `p.data =`
  with another shape.

Each test calls the compiled module a few times first, so the remembered state is in place
(asserted where tags are read, i.e. not on 3.13), then changes one thing, and compares with
eager and with torch.compile (results and graph counts)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch._dynamo

import ferrodyn
from ferrodyn import _C
from counting_backend import CountingBackend

TAGS = _C._dict_version({}) is not None  # False on 3.13: nothing is stamped there


@pytest.fixture(autouse=True)
def _fresh(fresh_ferrodyn):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("offset", torch.ones(4))

    def forward(self, x):
        return torch.relu(self.lin(x)) + self.offset


def _warm(mod):
    """(ferrodyn, torch.compile) wrappers of `mod`, each called three times, their backends,
    and an input; the ModuleCall's verdicts are remembered."""
    torch.manual_seed(0)
    fd_be, tc_be = CountingBackend(), CountingBackend()
    opt, ref = ferrodyn.compile(mod, backend=fd_be), torch.compile(mod, backend=tc_be)
    x = torch.randn(2, 4)
    for _ in range(3):
        assert torch.allclose(opt(x), mod(x)) and torch.allclose(ref(x), mod(x))
    assert opt._ferrodyn_call._stamped == (TAGS, TAGS, TAGS)
    assert fd_be.count == tc_be.count == 1
    return opt, ref, fd_be, tc_be, x


def _hook_for(kind, calls):
    if kind in ("forward",):
        def hook(m, args, out):
            calls.append(type(m).__name__)
            return out * 10
    elif kind == "forward_pre":
        def hook(m, args):
            calls.append(type(m).__name__)
            return (args[0] * 10,)
    else:  # backward, backward_pre: record only
        def hook(m, *grads):
            calls.append(type(m).__name__)
    return hook


_REGISTER = {
    "forward": lambda m, h: m.register_forward_hook(h),
    "forward_pre": lambda m, h: m.register_forward_pre_hook(h),
    "backward": lambda m, h: m.register_full_backward_hook(h),
    "backward_pre": lambda m, h: m.register_full_backward_pre_hook(h),
}
_REGISTER_GLOBAL = {
    "forward": torch.nn.modules.module.register_module_forward_hook,
    "forward_pre": torch.nn.modules.module.register_module_forward_pre_hook,
    "backward": torch.nn.modules.module.register_module_full_backward_hook,
    "backward_pre": torch.nn.modules.module.register_module_full_backward_pre_hook,
}


@pytest.mark.parametrize("where", ["orig", "wrapper", "global"])
@pytest.mark.parametrize("kind", ["forward", "forward_pre", "backward", "backward_pre"])
def test_hook_registered_after_the_verdict_runs(where, kind):
    mod = _Net()
    opt, ref, fd_be, tc_be, x = _warm(mod)
    calls: list[str] = []
    hook = _hook_for(kind, calls)
    if where == "global":
        handle = _REGISTER_GLOBAL[kind](hook)
    else:
        handle = _REGISTER[kind](mod if where == "orig" else opt, hook)
    try:
        xs = x.clone().requires_grad_(kind.startswith("backward"))
        calls.clear()
        # the reference: nn.Module.__call__ of the hooked module, which runs the hooks itself
        eager = torch.nn.Module.__call__(opt if where == "wrapper" else mod, xs)
        n_eager = len(calls)
        if kind.startswith("backward"):
            eager.sum().backward()
            n_eager = len(calls)
        calls.clear()
        got = opt(xs)
        if kind.startswith("backward"):
            got.sum().backward()
        # the hook ran through the compiled module (global hooks: for the wrapper and the
        # module inside it, as eager nn.Module calls of both would)
        if where == "wrapper" and kind.startswith("backward"):
            # a full backward hook on the wrapper (whose forward runs no module of its own)
            # fires neither through nn.Module.__call__ nor in torch.compile: the same here
            n_ferrodyn = len(calls)
            href = _REGISTER[kind](ref, hook)
            calls.clear()
            ref(xs).sum().backward()
            href.remove()
            assert n_ferrodyn == len(calls) == n_eager
        else:
            assert len(calls) >= n_eager > 0
        if where == "wrapper" or kind.startswith("backward"):
            assert torch.allclose(got, eager)
        elif where == "orig":
            assert torch.allclose(got, mod(x))
        else:  # global: the hook also fires for the wrapper (as in torch.compile), around
            # the original, whose eager call runs it for itself and its submodules (the stale
            # torch.compile entry does not guard hooks: skip_nnmodule_hook_guards)
            calls.clear()
            want = mod(xs) * 10 if kind == "forward" else mod(xs * 10)
            assert torch.allclose(got, want)
        assert opt._ferrodyn_call._stamped[("global", "wrapper", "orig").index(where)] is False
    finally:
        handle.remove()
    calls.clear()
    for _ in range(2):
        assert torch.allclose(opt(x), mod(x)) and calls == []
    assert opt._ferrodyn_call._stamped == (TAGS, TAGS, TAGS)  # stamped again once hook-free
    assert fd_be.count >= 1 and tc_be.count >= 1


@pytest.mark.parametrize("where", ["orig", "wrapper", "global"])
def test_hook_dict_replaced_with_a_full_one(where):
    mod = _Net()
    opt, ref, _, _, x = _warm(mod)

    def hook(m, args, out):
        return out - 100

    g = torch.nn.modules.module.__dict__
    if where == "global":
        saved = g["_global_forward_hooks"]
        g["_global_forward_hooks"] = OrderedDict({12345: hook})  # nn.Module.__call__ reads it
        try:
            # (the hook runs for the wrapper, the module inside it and its submodule)
            want = mod(x) - 100
            assert torch.allclose(opt(x), want) and torch.allclose(opt(x), want)
        finally:
            g["_global_forward_hooks"] = saved
    else:
        m = mod if where == "orig" else opt
        expected = mod(x) - 100
        object.__setattr__(m, "_forward_hooks", OrderedDict({12345: hook}))
        assert torch.allclose(opt(x), expected)
        object.__setattr__(m, "_forward_hooks", OrderedDict())
    assert torch.allclose(opt(x), mod(x))
    assert opt._ferrodyn_call._stamped == (TAGS, TAGS, TAGS)


def test_forward_assigned_on_orig_and_wrapper():
    mod = _Net()
    opt, ref, _, _, x = _warm(mod)
    mod.forward = lambda x: x * 3  # an instance attribute: nn.Module.__call__ uses it
    assert torch.equal(opt(x), x * 3) and torch.equal(mod(x), x * 3)
    del mod.forward
    assert torch.allclose(opt(x), mod(x))
    opt.forward = lambda x: x - 1
    assert torch.equal(opt(x), x - 1)
    assert opt._ferrodyn_call._stamped[1] is False


@pytest.mark.parametrize("on", ["instance", "class"])
def test_compiled_call_impl_after_the_verdict(on):
    class Net(_Net):
        pass

    mod = Net()
    opt, ref, _, _, x = _warm(mod)
    impl = lambda *a, **k: "compiled-impl"  # noqa: E731
    if on == "instance":
        object.__setattr__(mod, "_compiled_call_impl", impl)
    else:
        Net._compiled_call_impl = staticmethod(impl)  # a class change: its version tag moves
    try:
        assert mod(x) == "compiled-impl" and opt(x) == "compiled-impl"
    finally:
        if on == "instance":
            object.__setattr__(mod, "_compiled_call_impl", None)
        else:
            del Net._compiled_call_impl
    assert torch.allclose(opt(x), mod(x))


def test_class_changed_after_the_verdict():
    class Hooked(_Net):
        _compiled_call_impl = staticmethod(lambda *a, **k: "hooked class")

    mod = _Net()
    opt, ref, _, _, x = _warm(mod)
    mod.__class__ = Hooked
    assert mod(x) == "hooked class" and opt(x) == "hooked class"
    mod.__class__ = _Net
    assert torch.allclose(opt(x), mod(x))


def test_jit_trace_of_the_compiled_module():
    mod = _Net()
    opt, ref, fd_be, _, x = _warm(mod)
    traced = torch.jit.trace(opt, x, check_trace=False)
    # the trace went through nn.Module.__call__ (JIT tracing): it records the module scopes
    # and computes what the module computes
    y = torch.randn(2, 4)
    assert torch.allclose(traced(y), mod(y))
    assert torch.allclose(opt(y), mod(y))
    assert opt._ferrodyn_call._stamped == (TAGS, TAGS, TAGS)


def test_remembered_forward_follows_class_and_getattribute_changes():
    class Net(_Net):
        pass

    mod = Net()
    opt, ref, fd_be, tc_be, x = _warm(mod)
    assert opt._ferrodyn_call._forward_stamped is TAGS
    old = Net.forward
    Net.forward = lambda self, x: x * 7  # a class change: the type's tag moves
    try:
        assert torch.equal(opt(x), x * 7) and torch.equal(mod(x), x * 7)
        assert torch.equal(ref(x), x * 7)
    finally:
        Net.forward = old
    assert torch.allclose(opt(x), mod(x)) and torch.allclose(ref(x), mod(x))
    assert opt._ferrodyn_call._forward_stamped is TAGS


def test_forward_not_remembered_under_a_custom_getattribute():
    class Odd(_Net):
        def __getattribute__(self, name):
            if name == "forward":
                return lambda x: x + 1000
            return super().__getattribute__(name)

    mod = Odd()
    fd_be, tc_be = CountingBackend(), CountingBackend()
    opt = ferrodyn.compile(mod, backend=fd_be)
    x = torch.randn(2, 4)
    for _ in range(3):
        assert torch.equal(opt(x), mod(x)) and torch.equal(mod(x), x + 1000)
    assert opt._ferrodyn_call._forward_stamped is False


# -- the guard tree's same-class subtrees ----------------------------------------------------


class _MLP(torch.nn.Module):
    def __init__(self, depth=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class _Linear2(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def _mlp_pair():
    torch.manual_seed(0)
    mod = _MLP()
    fd_be, tc_be = CountingBackend(), CountingBackend()
    opt, ref = ferrodyn.compile(mod, backend=fd_be), torch.compile(mod, backend=tc_be)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            assert torch.allclose(opt(x), mod(x)) and torch.allclose(ref(x), mod(x))
    (entry,) = _C.cache_entries(_MLP.forward.__code__)
    walked, _ = entry.guards._plan_walked()
    # the later Linear layers' type(..).forward chains are not walked (their checks repeat the
    # first layer's)
    assert walked < len(entry.guards._nodes())
    return mod, opt, ref, fd_be, tc_be, x


@pytest.mark.parametrize("change", ["swap_class", "set_class", "instance_forward", "class_forward",
                                    "replace_module", "replace_parameter", "data_shape"])
def test_same_class_subtree_changes_are_seen(change):
    mod, opt, ref, fd_be, tc_be, x = _mlp_pair()
    layer = mod.layers[2]
    undo = lambda: None  # noqa: E731
    if change == "swap_class":
        new = _Linear2(4, 4)
        new.load_state_dict(layer.state_dict())
        mod.layers[2] = new
    elif change == "set_class":
        layer.__class__ = _Linear2
    elif change == "instance_forward":
        layer.forward = lambda x: x * 0 + 3
    elif change == "class_forward":
        old = torch.nn.Linear.forward
        torch.nn.Linear.forward = lambda self, x: torch.nn.functional.linear(x, self.weight, self.bias) + 1
        undo = lambda: setattr(torch.nn.Linear, "forward", old)  # noqa: E731
    elif change == "replace_module":
        mod.layers[2] = torch.nn.Linear(4, 4)
    elif change == "replace_parameter":
        layer.weight = torch.nn.Parameter(torch.randn(4, 4))
    else:  # data_shape: the parameter's metadata changes in place
        with torch.no_grad():
            mod.layers[3].weight.data = torch.randn(4, 4).t()  # another stride
    try:
        with torch.no_grad():
            expected = mod(x)
            assert torch.allclose(opt(x), expected)
            assert torch.allclose(opt(x), expected)  # the new entry (if any) hits
            got_ref = ref(x)
        if change == "class_forward":
            # torch.compile keeps running the old nn.Linear.forward here (it does not guard
            # the class attribute of its own modules); ferrodyn recompiles
            assert not torch.allclose(got_ref, expected) and fd_be.count == 2
        else:
            # parameters are graph inputs in both: a same-shape module or parameter swap
            # reuses the graph; a class or stride change recompiles
            assert torch.allclose(got_ref, expected)
            assert fd_be.count == tc_be.count, (fd_be.count, tc_be.count)
    finally:
        undo()

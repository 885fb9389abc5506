"""The guards that keep a compiled module's hooks current (variables/module_hooks.py ->
GuardKind.DICTS_EMPTY -> rust/guards/dicts_empty.rs): a module's empty hook dicts, and torch's
empty global hook dicts, are one leaf on the dict that holds them, which the guard replay
decides from that dict's version tag and the remembered hook dicts' lengths.

Every way of changing hooks after the first compiled call is covered twice: through
`ferrodyn.compile` against eager (results, how often each hook ran, graph counts), and on the
leaf itself (the replay's and the full path's outcome, the explanation). torch.compile is left
out of the results comparisons: it skips submodule hook guards by default
(`skip_nnmodule_hook_guards`) and keeps running its first graph.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.nn.modules import module as mm

import ferrodyn
from ferrodyn import _C
from compiled_vs_eager import same
from counting_backend import CountingBackend

# What a replay of an unchanged tree decides: True where dict versions are read (3.11, 3.12);
# None on 3.13, whose dict tags are not read (every replay defers to the full path there).
REPLAYED = None if _C._dict_version({}) is None else True
HOOK_DICTS = ("_backward_pre_hooks", "_backward_hooks", "_forward_pre_hooks", "_forward_hooks")
GLOBAL_DICTS = ("_global_backward_pre_hooks", "_global_backward_hooks",
                "_global_forward_pre_hooks", "_global_forward_hooks")


@pytest.fixture(autouse=True)
def _fresh(fresh_ferrodyn):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class MLP(nn.Module):
    def __init__(self, depth=3):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _counting(log, name, k):
    """A forward hook that counts its calls in the tensor `log[name]` (made here, outside the
    traced code; an in-place add is traced, where a Python counter or a list's length would be
    guarded and recompile every call) and scales the output by `k`."""
    count = log.setdefault(name, torch.zeros((), dtype=torch.int64))

    def hook(m, args, out):
        count.add_(1)
        return out * k
    return hook


def _pre_counting(log, name):
    count = log.setdefault(name, torch.zeros((), dtype=torch.int64))

    def hook(m, args):
        count.add_(1)
        return (args[0] + 1,)
    return hook


# change(model, log, handle) -> a handle to remove at the end (or None); `handle` is the hook
# registered on layers[0] before the first call.
def _register(model, log, handle):
    model.layers[1].register_forward_hook(_counting(log, "new", 3))


def _register_pre(model, log, handle):
    model.layers[2].register_forward_pre_hook(_pre_counting(log, "pre"))


def _remove(model, log, handle):
    handle.remove()


def _clear(model, log, handle):
    model.layers[0]._forward_hooks.clear()


def _replace_dict(model, log, handle):
    model.layers[1]._forward_hooks = OrderedDict([(12345, _counting(log, "new", 5))])


def _replace_then_register(model, log, handle):
    """An empty replacement (the same hooks: no recompile), then a hook on the new dict."""
    model.layers[1]._forward_hooks = OrderedDict()
    model.layers[1].register_forward_hook(_counting(log, "new", 7))


def _register_global(model, log, handle):
    return mm.register_module_forward_hook(_counting(log, "global", 11))


def _register_global_pre(model, log, handle):
    return mm.register_module_forward_pre_hook(_pre_counting(log, "global_pre"))


CHANGES = [_register, _register_pre, _remove, _clear, _replace_dict, _replace_then_register,
           _register_global, _register_global_pre]


def _calls(model):
    def run(x):
        return model(x)
    return run


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.lstrip("_") for c in CHANGES])
def test_hook_changes_after_the_first_compiled_call(change):
    """Eager and ferrodyn each get their own model (same weights), with one forward hook on
    layers[0]; two calls, the change, two more calls: results and each hook's call count are
    eager's, and the change recompiles exactly once (the second call after it hits)."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(2, 4, generator=g) for _ in range(4)]
    runs = {}
    for compile_ in (None, ferrodyn.compile):
        torch.manual_seed(0)
        model, log = MLP(), {}
        handle = model.layers[0].register_forward_hook(_counting(log, "first", 2))
        backend = CountingBackend()
        # a function calling the model: the compiled wrapper module would be one more module
        # for global hooks (as with torch.compile)
        fn = _calls(model) if compile_ is None else compile_(_calls(model), backend=backend)
        outs = [fn(xs[0]), fn(xs[1])]
        added = change(model, log, handle)
        try:
            outs += [fn(xs[2]), fn(xs[3])]
        finally:
            if added is not None:
                added.remove()
        runs[compile_] = (outs, {k: int(v) for k, v in log.items()}, backend.count)
    (want, want_log, _), (got, got_log, count) = runs[None], runs[ferrodyn.compile]
    assert same(got, want) and got_log == want_log, (got_log, want_log)
    assert not same(want[2], _unchanged_result(xs[2])), "the change must matter"
    assert count == 2, count


def _unchanged_result(x):
    """What the first graph computes for `x` (no change applied)."""
    torch.manual_seed(0)
    model, log = MLP(), {}
    model.layers[0].register_forward_hook(_counting(log, "first", 2))
    return model(x)


def test_empty_replacement_keeps_the_entry():
    """Replacing an empty hook dict by another empty one changes the module's `__dict__`
    version: the full path decides again, passes, and no recompile happens."""
    model = MLP()
    backend = CountingBackend()
    fn = ferrodyn.compile(model, backend=backend)
    x = torch.randn(2, 4)
    fn(x)
    for layer in model.layers:
        layer._forward_hooks = OrderedDict()
        layer._backward_hooks = OrderedDict()
    assert same(fn(x), model(x)) and same(fn(x), model(x))
    assert backend.count == 1


def test_global_backward_hook_added_later_runs_eagerly_with_eager_gradients():
    """A global full backward hook registered after the first call fails the globals' leaf;
    the recompile refuses the module calls (backward hooks), so gradients and hook calls are
    eager's."""
    def run(compile_):
        torch.manual_seed(0)
        model, log = MLP(), {}
        backend = CountingBackend()
        fn = _calls(model) if compile_ is None else compile_(_calls(model), backend=backend)
        g = torch.Generator().manual_seed(1)
        x, y = (torch.randn(2, 4, generator=g).requires_grad_() for _ in range(2))
        fn(x).sum().backward()
        handle = mm.register_module_full_backward_hook(lambda m, gi, go: log.setdefault("n", []).append(type(m).__name__))
        try:
            out = fn(y)
            out.sum().backward()
        finally:
            handle.remove()
        return out, log, x.grad, y.grad, [p.grad for p in model.parameters()], backend.count

    want, got = run(None), run(ferrodyn.compile)
    # the hook fired for every module, as in eager: the first entry's guards failed (had it
    # run, no backward hook would have been attached)
    assert same(got[:5], want[:5]) and len(got[1]["n"]) == 4, (got[1], want[1])


def _entry_tree(code):
    (entry,) = _C.cache_entries(code)
    return entry.guards


def test_compiled_entry_has_one_hook_leaf_per_module():
    """The MLP's entry guards each Linear's hook dicts with one leaf on its `__dict__` and
    torch's global hook dicts with one leaf; no per-dict length leaves are left."""
    model = MLP()
    fn = ferrodyn.compile(model, backend=CountingBackend())
    x = torch.randn(2, 4)
    fn(x)
    fn(x)
    tree = _entry_tree(MLP.forward.__code__)
    leaves = tree.leaves()
    hook_leaves = [s for s in leaves if "_forward_hooks" in s]
    assert len(hook_leaves) == 4, hook_leaves  # 3 Linears + the globals
    assert sum("_global_forward_hooks" in s for s in hook_leaves) == 1
    assert not any(s.startswith("len(") and "hooks" in s for s in leaves)
    slots = (model, x)
    assert tree._replay(slots, MLP.forward.__globals__) is REPLAYED
    model.layers[2].register_forward_pre_hook(lambda m, a: None)
    assert tree._replay(slots, MLP.forward.__globals__) is (None if REPLAYED is None else False)
    assert not tree.check(slots, MLP.forward.__globals__)
    assert "'_forward_pre_hooks'" in tree.explain(slots, MLP.forward.__globals__)


# -- the leaf itself ------------------------------------------------------------------------------

def _module_tree():
    b = _C.GuardBuilder()
    b.dicts_empty(b.dict_of(b.local(0, "m")), list(HOOK_DICTS))
    return b.build()


def _outcomes(tree, slots):
    """(replay alone, full path alone, check) on `slots`; the full path refreshes the replay's
    memory, so the replay is asked first."""
    return tree._replay(slots), tree._full_check(slots), tree.check(slots)


def test_leaf_follows_in_place_changes_of_a_hook_dict():
    lin = nn.Linear(2, 2)
    tree = _module_tree()
    assert tree.replayable
    assert _outcomes(tree, (lin,)) == (None, True, True)  # nothing remembered yet
    assert tree._replay((lin,)) is REPLAYED
    handle = lin.register_forward_hook(lambda m, a, out: out)
    # the module's __dict__ did not change: the replay reads the remembered dict's length
    assert _outcomes(tree, (lin,)) == (None if REPLAYED is None else False, False, False)
    assert tree.explain((lin,)) == (
        "all(len(L['m'].__dict__[k]) == 0 for k in ('_backward_pre_hooks', '_backward_hooks', "
        "'_forward_pre_hooks', '_forward_hooks')) (len of '_forward_hooks' is 1)")
    handle.remove()
    assert _outcomes(tree, (lin,)) == (REPLAYED, True, True)
    lin.register_full_backward_pre_hook(lambda m, go: None)
    assert _outcomes(tree, (lin,)) == (None if REPLAYED is None else False, False, False)
    lin._backward_pre_hooks.clear()
    assert _outcomes(tree, (lin,)) == (REPLAYED, True, True)


def test_leaf_follows_a_replaced_hook_dict():
    lin = nn.Linear(2, 2)
    tree = _module_tree()
    assert tree.check((lin,)) and tree._replay((lin,)) is REPLAYED
    old = lin._forward_hooks
    lin._forward_hooks = OrderedDict()  # a new version of lin.__dict__: the full path decides
    assert _outcomes(tree, (lin,)) == (None, True, True)
    assert tree._replay((lin,)) is REPLAYED
    old[1] = lambda m, a, out: out  # the old dict is no longer the module's
    assert _outcomes(tree, (lin,)) == (REPLAYED, True, True)
    lin._forward_hooks[2] = lambda m, a, out: out  # the new one is
    assert _outcomes(tree, (lin,)) == (None if REPLAYED is None else False, False, False)
    lin._forward_hooks = OrderedDict([(3, print)])
    assert _outcomes(tree, (lin,)) == (None, False, False)


def test_leaf_on_other_modules_and_holders():
    tree = _module_tree()
    a, b = nn.Linear(2, 2), nn.ReLU()
    assert tree.check((a,)) and tree.check((b,)) and tree.check((a,))
    b.register_forward_hook(lambda m, i, o: o)
    assert tree.check((a,)) and not tree.check((b,))
    # a missing key, a value without len(), a dict subclass (decided by the full path)
    del a.__dict__["_backward_hooks"]
    assert not tree.check((a,))
    assert tree.explain((a,)).endswith("('_backward_hooks' could not be read)")
    c = nn.Linear(2, 2)
    c.__dict__["_forward_hooks"] = 0
    assert not tree.check((c,)) and "holds an object of type int without len()" in tree.explain((c,))

    class Hooks(OrderedDict):
        pass
    c.__dict__["_forward_hooks"] = Hooks()
    assert tree.check((c,)) and tree._replay((c,)) is None
    c._forward_hooks[1] = print
    assert not tree.check((c,))


def test_leaf_on_torch_global_hook_dicts():
    b = _C.GuardBuilder()
    b.dicts_empty(b.local(0, "g"), list(GLOBAL_DICTS))
    tree = b.build()
    g = (vars(mm),)
    assert tree.check(g) and tree._replay(g) is REPLAYED
    handle = mm.register_module_forward_pre_hook(lambda m, a: None)
    try:
        assert _outcomes(tree, g) == (None if REPLAYED is None else False, False, False)
    finally:
        handle.remove()
    assert _outcomes(tree, g) == (REPLAYED, True, True)


def test_leaf_needs_keys():
    b = _C.GuardBuilder()
    with pytest.raises(ValueError, match="at least one key"):
        b.dicts_empty(b.local(0, "m"), [])

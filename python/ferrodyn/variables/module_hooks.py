"""nn.Module forward hooks on a module called from traced code, run the way
`nn.Module._call_impl` runs them (torch/nn/modules/module.py), each hook inlined like a user
function.

Owns `read_hooks` (which hooks a call runs, with the guards that keep that true: the keys, in
order, of the module's and torch's global hook dicts, and each hook through its Source) and
`call_module` (the call itself: global then module forward pre-hooks, `forward`, global then
module forward hooks, with `_call_impl`'s result rules). Backward hooks (module or global) are
refused: `BackwardHook` wraps inputs and outputs in autograd nodes that are not modelled.
Registering or removing a hook inside the traced code is refused by SideEffects (the hook dicts
are module internals). Does not own module attribute lookup or the module tree
(nn_module.py).

Order and result rules (`_call_impl`, torch 2.x):
- pre-hooks: `_global_forward_pre_hooks` then `m._forward_pre_hooks`, in dict order (a
  `prepend=True` hook is first in its dict). A hook whose id is in
  `m._forward_pre_hooks_with_kwargs` is called `hook(m, args, kwargs)` and may return None or
  a 2-tuple `(args, kwargs)`; any other is called `hook(m, args)` and a non-None result
  replaces `args` (wrapped in a 1-tuple unless it is a tuple).
- `m.forward` (read before the pre-hooks run) is called with `*args, **kwargs`.
- forward hooks: `_global_forward_hooks` then `m._forward_hooks`; with kwargs (id in
  `m._forward_hooks_with_kwargs` or `_global_forward_hooks_with_kwargs`) called
  `hook(m, args, kwargs, result)`, else `hook(m, args, result)`; a non-None result replaces
  the output.
- `always_call=True` hooks only differ when the call raises: an exception raised in the traced
  call while such a hook has not run yet is refused (eager runs the hook, then re-raises).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.modules.module as _mm

from ferrodyn.exc import BreakReason
from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import AttrSource, DictOfSource, GlobalSource, ItemSource, Source, TypeSource
from ferrodyn.variables.base import VariableTracker, unsupported

# module-level hook dicts of torch.nn.modules.module, refused when not empty
_GLOBAL_BACKWARD = ("_global_backward_pre_hooks", "_global_backward_hooks")
# per-module hook dicts, refused when not empty
_MODULE_BACKWARD = ("_backward_pre_hooks", "_backward_hooks")
# the hook dicts every call reads (the kwargs / always_call ones only when hooks are present)
_GLOBAL_READ = _GLOBAL_BACKWARD + ("_global_forward_pre_hooks", "_global_forward_hooks")
_MODULE_READ = _MODULE_BACKWARD + ("_forward_pre_hooks", "_forward_hooks")


@dataclass
class Hook:
    """One hook as `_call_impl` calls it."""
    hook_id: int
    var: VariableTracker
    with_kwargs: bool
    always_call: bool = False


@dataclass
class HookPlan:
    pre: list[Hook] = field(default_factory=list)
    post: list[Hook] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.pre or self.post)


def _globals_source(tx, mod) -> Source | None:
    """A Source of `torch.nn.modules.module.__dict__` reachable from the frame, shared by every
    module call of the capture: `type(m)._call_impl.__globals__` of a sourced module, else
    through a frame global (`_through_global`). (Not `type(m).__call__`: `type` has a
    `__call__` of its own, so the guard replay could not decide that attribute.)"""
    out = tx.output
    cached = getattr(out, "_ferrodyn_hook_globals", None)
    if cached is not None:
        return cached
    src = None
    if mod.source is not None:
        src = _module_globals_through_class(tx, type(mod.value), TypeSource(mod.source))
    if src is None:
        for name, value in out.f_globals.items():
            src = _through_global(tx, name, value)
            if src is not None:
                break
    if src is not None:
        out._ferrodyn_hook_globals = src
    return src


def _through_global(tx, name: Any, value: Any) -> Source | None:
    """`torch.nn.modules.module.__dict__` reached from frame global `name` (the `torch` or
    `torch.nn` module, or an nn.Module subclass), else None."""
    if not isinstance(name, str):
        return None
    path = {id(torch): ("nn", "modules", "module"), id(torch.nn): ("modules", "module")}.get(id(value))
    if path is not None:
        src: Source = GlobalSource(name)
        for attr in path:
            src = AttrSource(src, attr)
        return DictOfSource(src)
    if isinstance(value, type) and issubclass(value, torch.nn.Module):
        return _module_globals_through_class(tx, value, GlobalSource(name))
    return None


# functions of nn.Module whose `__globals__` is torch.nn.modules.module's namespace
_MODULE_FUNCTIONS = ("_call_impl", "_wrapped_call_impl", "register_forward_hook")


def _module_globals_through_class(tx, cls: type, cls_src: Source) -> Source | None:
    """`cls.<f>.__globals__` for the first function `f` of `_MODULE_FUNCTIONS` that `cls` does
    not override, with the guard that it is still that namespace."""
    for attr in _MODULE_FUNCTIONS:
        fn = getattr(cls, attr, None)
        if getattr(fn, "__globals__", None) is vars(_mm):
            src = AttrSource(AttrSource(cls_src, attr), "__globals__")
            tx.output.install_guard(src, GuardKind.ID_MATCH, vars(_mm))
            return src
    return None


def _guard_dict(tx, src: Source | None, d: dict) -> None:
    if src is None:
        return
    if len(d):
        tx.output.install_guard(src, GuardKind.DICT_KEYS, tuple(d))
    else:
        tx.output.install_guard(src, GuardKind.LENGTH, 0)


def _guard_dicts(tx, holder_src: Source | None, dicts: dict[str, dict]) -> None:
    """Guard hook dicts read from one holder (a module's `__dict__`, or torch's module
    namespace): the empty ones as one DICTS_EMPTY leaf on the holder (the guard replay decides
    it from the holder's version and the remembered dicts' lengths), each other one by its
    keys."""
    if holder_src is None:
        return
    empty = tuple(k for k, d in dicts.items() if not len(d))
    if empty:
        tx.output.install_guard(holder_src, GuardKind.DICTS_EMPTY, empty)
    for k, d in dicts.items():
        if len(d):
            _guard_dict(tx, ItemSource(holder_src, k), d)


def _hook_var(tx, hook: Any, src: Source | None) -> VariableTracker:
    from ferrodyn.variables.functions import _lazy
    return tx.realize(_lazy(hook, src))


def read_hooks(tx, mod) -> HookPlan:
    """The forward hooks a call of module tracker `mod` runs, guarded; backward hooks refused."""
    m = mod.value
    d = m.__dict__
    name = type(m).__name__
    msrc = DictOfSource(mod.source) if mod.source is not None else None

    def module_dict(key: str, guard: bool = True) -> tuple[dict, Source | None]:
        hooks = d.get(key)
        if not isinstance(hooks, dict):
            unsupported(f"module {name} without {key} (not initialised by Module.__init__)",
                        BreakReason.UNSUPPORTED_CALL)
        src = ItemSource(msrc, key) if msrc is not None else None
        if guard:
            _guard_dict(tx, src, hooks)
        if len(hooks) and src is None:
            unsupported(f"hooks of module {name} made in the traced code", BreakReason.UNSUPPORTED_CALL)
        return hooks, src

    gsrc = _globals_source(tx, mod)
    if gsrc is None:
        unsupported("global nn.Module hooks cannot be guarded here (no Source reaches "
                    "torch.nn.modules.module from this frame)", BreakReason.UNSUPPORTED_CALL)

    def global_dict(key: str) -> tuple[dict, Source]:
        g = getattr(_mm, key)
        _guard_dict(tx, ItemSource(gsrc, key), g)
        return g, ItemSource(gsrc, key)

    def hooks_of(*dicts: tuple[dict, Source | None]):
        """(id, tracker) of each hook of `dicts`, in call order."""
        return [(hid, _hook_var(tx, hook, ItemSource(src, hid) if src is not None else None))
                for hooks, src in dicts for hid, hook in hooks.items()]

    # The hook dicts every call reads, each guarded (empty ones folded into one leaf per
    # holder) before anything is refused.
    mods = {k: module_dict(k, guard=False) for k in _MODULE_READ}
    _guard_dicts(tx, msrc, {k: hooks for k, (hooks, _) in mods.items()})
    globs = {k: (getattr(_mm, k), ItemSource(gsrc, k)) for k in _GLOBAL_READ}
    _guard_dicts(tx, gsrc, {k: g for k, (g, _) in globs.items()})
    for key in _GLOBAL_BACKWARD:
        if globs[key][0]:
            unsupported(f"global nn.Module backward hooks ({key})", BreakReason.UNSUPPORTED_CALL)
    for key in _MODULE_BACKWARD:
        if mods[key][0]:
            unsupported(f"module {name} has backward hooks ({key})", BreakReason.UNSUPPORTED_CALL)

    plan = HookPlan()
    g_pre, pre = globs["_global_forward_pre_hooks"], mods["_forward_pre_hooks"]
    if g_pre[0] or pre[0]:
        pre_kw = module_dict("_forward_pre_hooks_with_kwargs")[0]
        plan.pre = [Hook(hid, var, hid in pre_kw) for hid, var in hooks_of(g_pre, pre)]

    g_post, post = globs["_global_forward_hooks"], mods["_forward_hooks"]
    if g_post[0] or post[0]:
        kw = (module_dict("_forward_hooks_with_kwargs")[0],
              global_dict("_global_forward_hooks_with_kwargs")[0])
        always = (module_dict("_forward_hooks_always_called")[0],
                  global_dict("_global_forward_hooks_always_called")[0])
        plan.post = [Hook(hid, var, any(hid in k for k in kw), any(hid in a for a in always))
                     for hid, var in hooks_of(g_post, post)]
    return plan


def _is_none(v: VariableTracker) -> bool:
    from ferrodyn.variables.constant import ConstantVariable
    return isinstance(v, ConstantVariable) and v.value is None


def _type_of(v: VariableTracker) -> type | None:
    try:
        return v.python_type()
    except Exception:
        return None


def _pre_hook_result(tx, hook: Hook, res, args_var, kwargs_var):
    """(args, kwargs) after one pre-hook returned the (realized) tracker `res`."""
    from ferrodyn.variables.lists import TupleVariable
    if _is_none(res):
        return args_var, kwargs_var
    t = _type_of(res)
    if hook.with_kwargs:
        items = res.unpack(tx) if t is not None and issubclass(t, tuple) else None
        if items is None or len(items) != 2:
            unsupported("RuntimeError: forward pre-hook must return None or a tuple of "
                        "(new_args, new_kwargs)", BreakReason.EXCEPTION)
        return tx.realize(items[0]), tx.realize(items[1])
    if t is None:
        unsupported(f"forward pre-hook returned {res.describe()} (its type is not known)",
                    BreakReason.UNSUPPORTED_TYPE)
    return (res if issubclass(t, tuple) else TupleVariable(items=(res,))), kwargs_var


def _forward_arguments(tx, args_var, kwargs_var) -> tuple[list, dict]:
    """`forward(*args, **kwargs)`'s arguments, unpacked as CALL_FUNCTION_EX does."""
    from ferrodyn.variables.dicts import DictVariable
    args = args_var.iterator(tx).unpack(tx)
    if not isinstance(kwargs_var, DictVariable):
        unsupported(f"** of {kwargs_var.describe()} (a forward pre-hook's kwargs)",
                    BreakReason.UNSUPPORTED_TYPE)
    kwargs = dict(kwargs_var.state.items)
    if not all(isinstance(k, str) for k in kwargs):
        unsupported("keywords must be strings", BreakReason.EXCEPTION)
    return args, kwargs


def call_module(tx, mod, args: list, kwargs: dict) -> VariableTracker:
    """`mod(*args, **kwargs)` for a module whose `__call__` is `nn.Module.__call__`."""
    plan = read_hooks(tx, mod)
    forward = tx.realize(mod.var_getattr(tx, "forward"))
    if not plan:
        return forward.call_function(tx, args, kwargs)
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.exceptions import TracedException
    from ferrodyn.variables.lists import TupleVariable
    args_var: VariableTracker = TupleVariable(items=tuple(args))
    kwargs_var: VariableTracker = DictVariable.new(dict(kwargs))
    called: set[int] = set()
    try:
        for hook in plan.pre:
            call_args = [mod, args_var, kwargs_var] if hook.with_kwargs else [mod, args_var]
            res = tx.realize(hook.var.call_function(tx, call_args, {}))
            args_var, kwargs_var = _pre_hook_result(tx, hook, res, args_var, kwargs_var)
        f_args, f_kwargs = _forward_arguments(tx, args_var, kwargs_var)
        result = tx.realize(forward.call_function(tx, f_args, f_kwargs))
        for hook in plan.post:
            called.add(hook.hook_id)
            call_args = [mod, args_var, kwargs_var, result] if hook.with_kwargs \
                else [mod, args_var, result]
            res = tx.realize(hook.var.call_function(tx, call_args, {}))
            if not _is_none(res):
                result = res
    except TracedException:
        if any(h.always_call and h.hook_id not in called for h in plan.post):
            unsupported(f"an exception in a call of module {type(mod.value).__name__} with an "
                        f"always_call forward hook (eager runs the hook, then re-raises)",
                        BreakReason.EXCEPTION)
        raise
    return result

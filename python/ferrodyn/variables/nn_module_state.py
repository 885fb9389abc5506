"""nn.Module state changed inside the traced frame: `register_buffer`, `add_module`,
`ModuleList.append`, `ModuleDict[k] = m`, `self.sub = module`, `self.buf = tensor`,
`del self.buf`, a class's own `__setattr__`.

How it is modelled: torch's own code runs (inlined: `Module.__setattr__`, `register_buffer`,
`add_module`, ...) and writes into the module's `_parameters`, `_buffers` and `_modules` dicts
through their dict trackers, which SideEffects records and replays after the graph
(`clear(); update(new)`: the dicts keep their identity, so a later call's guards on them see
the new keys and values). What makes that sound is that every reader of those dicts in the
converter asks `module_dict` first: once the trace has mutated one, its tracker is the truth
(pending values, pending deletions) for attribute lookup, the module tree and hasattr.

Owns `MODELLED_MODULE_DICTS`, `module_dict` (the truth of one of them during the trace),
`is_plain_store` (when `Module.__setattr__`/`__delattr__` reduces to `object.__setattr__`/
`__delattr__`, recorded directly without inlining torch's code) and the refusal of stores that
would replace a module's internal containers themselves. The hook dicts stay unmodelled
(SideEffects refuses their mutation). Does not own attribute lookup (nn_module.py) or the
dict trackers (dicts.py).
"""

from __future__ import annotations

from typing import Any

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import LazyVariable, VariableTracker, unsupported

# the module dicts whose mutation is modelled (`nn.Module.__getattr__` reads them)
MODELLED_MODULE_DICTS = ("_parameters", "_buffers", "_modules")

# the containers `nn.Module.__init__` makes (dicts, the non-persistent buffer set): an attribute
# store replacing one of them is refused (the converter reads them as the module's state)
_INTERNAL_CONTAINERS = frozenset(k for k, v in vars(torch.nn.Module()).items()
                                 if isinstance(v, (dict, set, list)))


def pending_module_dict(tx, m: torch.nn.Module, dict_name: str) -> VariableTracker | None:
    """The dict tracker of `m.__dict__[dict_name]` when this trace has mutated that dict (it
    then holds the pending items), else None (the real dict is the truth)."""
    d = m.__dict__.get(dict_name)
    if not isinstance(d, dict):
        return None
    se = tx.output.side_effects
    as_dict = getattr(se.tracked(m.__dict__, None), "state", None)
    if as_dict is not None and se.was_mutated(as_dict):
        held = as_dict.items.get(dict_name)
        if not (isinstance(held, LazyVariable) and held.value is d):
            unsupported(f"module {type(m).__name__}'s {dict_name} replaced through its __dict__",
                        BreakReason.SIDE_EFFECT)
    var = se.tracked(d, None)
    state = getattr(var, "state", None)
    if state is None or not se.was_mutated(state):
        return None
    return var


def module_dict(tx, m: torch.nn.Module, dict_name: str) -> dict | None:
    """`m.<dict_name>` as the trace sees it now: key -> tracker (pending items of a mutated
    dict; else the real dict's values, not yet wrapped: callers make their Sources), or None
    when the module has no such dict (before `Module.__init__`)."""
    var = pending_module_dict(tx, m, dict_name)
    if var is not None:
        return var.state.items
    d = m.__dict__.get(dict_name)
    return d if isinstance(d, dict) else None


def is_none_tracker(tx, v: Any) -> bool:
    """Whether a dict item (a tracker or a raw value of the real dict) is None."""
    if isinstance(v, LazyVariable):
        return v.value is None
    if isinstance(v, VariableTracker):
        v = tx.realize(v)
        return v.is_python_constant() and v.as_python_constant() is None
    return v is None


def is_plain_store(tx, mod, name: str, value: VariableTracker | None) -> bool:
    """Whether `Module.__setattr__(name, value)` (or `__delattr__(name)` when value is None)
    is `object.__setattr__`/`__delattr__`: the class uses torch's own hook, `name` is in none of
    the three dicts (as the trace sees them; the real dicts' key sets are guarded) and the value
    is no Parameter, Buffer or Module. False: torch's code is inlined instead."""
    from ferrodyn.guard_spec import GuardKind
    from ferrodyn.source import DictOfSource, ItemSource
    m = mod.value
    hook = "__setattr__" if value is not None else "__delattr__"
    if getattr(type(m), hook) is not getattr(torch.nn.Module, hook):
        return False
    check_internal_store(m, name)
    for dict_name in MODELLED_MODULE_DICTS:
        d = m.__dict__.get(dict_name)
        if not isinstance(d, dict):
            unsupported(f"module {type(m).__name__} before Module.__init__",
                        BreakReason.SIDE_EFFECT)
        if mod.source is not None:
            tx.output.install_guard(
                ItemSource(DictOfSource(mod.source), dict_name), GuardKind.DICT_KEYS, tuple(d))
        if name in module_dict(tx, m, dict_name):
            return False
    if value is None:
        return True
    value = tx.realize(value)
    try:
        t = value.python_type()
    except Exception:
        return False  # torch's isinstance checks decide
    buffer = getattr(torch.nn, "Buffer", None)
    return not (isinstance(t, type) and (issubclass(t, (torch.nn.Parameter, torch.nn.Module)) or
                                         buffer is not None and issubclass(t, buffer)))


def class_hook(tx, mod, hook: str) -> VariableTracker:
    """`type(m).__setattr__` / `__delattr__` bound to the module, read through the class's
    Source when the module has one (torch's code then reads its own globals, e.g.
    `_global_module_registration_hooks`, through Sources that guard them). Refused when it is
    not Python code."""
    import types
    from ferrodyn.variables.user_objects import class_attr_tracker, lookup_class_attr
    cls = type(mod.value)
    attr = lookup_class_attr(cls, hook)
    if not isinstance(attr, types.FunctionType):
        unsupported(f"{cls.__name__}.{hook} is not Python code", BreakReason.SIDE_EFFECT)
    if mod.source is None:
        unsupported(f"mutation of a {cls.__name__} that cannot be reached from the frame",
                    BreakReason.SIDE_EFFECT)
    return class_attr_tracker(tx, cls, mod.type_source(), hook, attr, mod)


def object_key(tx, v: Any) -> Any:
    """A key equal for two module-dict items that are the same object (the dedup of
    `named_parameters`/`named_buffers`/`named_modules`): an item not used yet (a LazyVariable)
    or a tracker of an object from the frame keys by that object's id; a value made in the
    frame (a graph tensor) by its tracker's identity."""
    if isinstance(v, LazyVariable):
        return ("id", id(v.value))
    v = tx.realize(v)
    hit = tx.output.side_effects.tracked_object(v)
    if hit is not None:
        return ("id", id(hit[0]))
    value = getattr(v, "value", None)
    if isinstance(value, torch.nn.Module):
        return ("id", id(value))
    return ("tracker", v.identity())


def check_internal_store(m: torch.nn.Module, name: str) -> None:
    """Refuse an attribute store or deletion that would replace one of the module's internal
    containers (however reached: `Module.__setattr__`, `object.__setattr__`, a custom hook)."""
    if name in _INTERNAL_CONTAINERS and name in m.__dict__:
        unsupported(f"replacing nn.Module internal container {name!r} of a "
                    f"{type(m).__name__}", BreakReason.SIDE_EFFECT)

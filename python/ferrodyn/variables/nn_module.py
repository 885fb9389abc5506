"""nn.Module instances: attribute reads with Sources that avoid `nn.Module.__getattr__`, and
calls that inline the module's `forward` like any user method.

Owns `NNModuleVariable`: attribute lookup falls back (as `nn.Module.__getattr__` does) to
`_parameters`, `_buffers` and `_modules`, reached as `DictOf(m)['_parameters']['w']`, so a
parameter becomes a lifted graph input guarded by TENSOR_MATCH; module calls check that no
hooks are installed (guarded) and inline `forward`; `Sequential`/`ModuleList` indexing by table.
Layers are not special-cased: their forward is traced like user code. Does not own building
(builder.py) or generic attribute lookup (user_objects.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import DictOfSource, ItemSource
from ferrodyn.variables.base import LazyVariable, VariableTracker, unsupported
from ferrodyn.variables.user_objects import UserObjectVariable, _sub

_FALLBACK_DICTS = ("_parameters", "_buffers", "_modules")
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks", "_forward_hooks_with_kwargs")


@dataclass(frozen=True, eq=False)
class NNModuleVariable(UserObjectVariable):
    def describe(self):
        return f"module {type(self.value).__name__}"

    def fallback_attr(self, tx, name):
        d = self.value.__dict__
        for dict_name in _FALLBACK_DICTS:
            sub = d.get(dict_name)
            if sub is not None and name in sub:
                src = _sub(self.source, lambda s: ItemSource(ItemSource(DictOfSource(s),
                                                                        dict_name), name))
                from ferrodyn.variables.functions import _lazy
                return _lazy(sub[name], src)
        return None

    def _check_hooks(self, tx):
        m = self.value
        mod = torch.nn.modules.module
        for glob in ("_global_forward_hooks", "_global_forward_pre_hooks",
                     "_global_backward_hooks", "_global_backward_pre_hooks"):
            if getattr(mod, glob, None):
                unsupported("global nn.Module hooks", BreakReason.UNSUPPORTED_CALL)
        for name in _HOOK_DICTS:
            hooks = m.__dict__.get(name)
            if hooks is None:
                continue
            if len(hooks):
                unsupported(f"module {type(m).__name__} has {name}", BreakReason.UNSUPPORTED_CALL)
            if self.source is not None and name in ("_forward_hooks", "_forward_pre_hooks"):
                tx.output.install_guard(ItemSource(DictOfSource(self.source), name),
                                        GuardKind.LENGTH, 0)

    def call_function(self, tx, args, kwargs):
        self._check_hooks(tx)
        call = type(self.value).__call__
        if call is not torch.nn.Module.__call__:
            return super().call_function(tx, args, kwargs)
        forward = tx.realize(self.var_getattr(tx, "forward"))
        return forward.call_function(tx, args, kwargs)

    # -- mutation: nn.Module.__setattr__ / __delattr__ modelled for plain attributes -------
    def _plain_module_attr(self, tx, name, verb: str, value=None) -> None:
        """Refuse unless `Module.__setattr__`/`__delattr__` reduces to `object.__setattr__`/
        `object.__delattr__` here (torch/nn/modules/module.py): the class does not override
        them, `name` is not a parameter, buffer or submodule (their dicts' keys are guarded),
        and the value is not a Parameter, Buffer or Module (those register themselves)."""
        m = self.value
        hook = "__setattr__" if verb == "set" else "__delattr__"
        if getattr(type(m), hook) is not getattr(torch.nn.Module, hook):
            unsupported(f"{type(m).__name__}.{hook} (a custom {hook} is not modelled)",
                        BreakReason.SIDE_EFFECT)
        self._plain_slot_check(tx, name)
        src = DictOfSource(self.source)
        for dict_name in _FALLBACK_DICTS:
            d = m.__dict__.get(dict_name)
            if not isinstance(d, dict):
                unsupported(f"module {type(m).__name__} before Module.__init__",
                            BreakReason.SIDE_EFFECT)
            if name in d:
                unsupported(f"assignment to {dict_name[1:-1]} {name!r} of a module",
                            BreakReason.SIDE_EFFECT)
            tx.output.install_guard(ItemSource(src, dict_name), GuardKind.DICT_KEYS, tuple(d))
        if value is not None:
            value = tx.realize(value)
            try:
                t = value.python_type()
            except Exception:
                unsupported(f"assignment of {value.describe()} to a module attribute",
                            BreakReason.SIDE_EFFECT)
            buffer = getattr(torch.nn, "Buffer", None)
            if issubclass(t, (torch.nn.Parameter, torch.nn.Module)) or \
                    (buffer is not None and isinstance(t, type) and issubclass(t, buffer)):
                unsupported(f"assignment of a {t.__name__} to module attribute {name!r}",
                            BreakReason.SIDE_EFFECT)

    def setattr(self, tx, name, value):
        self._plain_module_attr(tx, name, "set", value)
        self.record_store(tx, name, value)

    def delattr(self, tx, name):
        self._plain_module_attr(tx, name, "del")
        self.record_delete(tx, name)

    def _tree_method(self, tx, name):
        """The table's handler of `name` when it is `nn.Module`'s own method, unshadowed."""
        handler = _TREE_METHODS.get(name)
        if handler is None or getattr(type(self.value), name, None) is not \
                getattr(torch.nn.Module, name) or name in self.value.__dict__:
            return None
        self.guard_unshadowed(tx, name)
        return handler

    def var_getattr(self, tx, name):
        if self._tree_method(tx, name) is not None:
            from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        return super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        handler = self._tree_method(tx, name)
        if handler is not None:
            return handler(tx, self, *args, **kwargs)
        return super().call_method(tx, name, args, kwargs)

    def _children(self, tx, dict_name: str) -> list[tuple[str, VariableTracker]]:
        """(name, lazy tracker) of `_modules`/`_parameters`/`_buffers`, keys guarded."""
        from ferrodyn.variables.functions import _lazy
        d = self.value.__dict__[dict_name]
        src = _sub(self.source, lambda s: ItemSource(DictOfSource(s), dict_name))
        if src is not None:
            tx.output.install_guard(src, GuardKind.DICT_KEYS, tuple(d))
        return [(k, _lazy(v, ItemSource(src, k) if src else None)) for k, v in d.items()
                if v is not None]

    def walk(self, tx, prefix: str = "") -> list[tuple[str, "NNModuleVariable"]]:
        out = [(prefix, self)]
        for k, child in self._children(tx, "_modules"):
            child = tx.realize(child)
            out.extend(child.walk(tx, f"{prefix}.{k}" if prefix else k))
        return out

    def getitem(self, tx, index):
        handler = _GETITEM.get(type(self.value).__getitem__)
        if handler is not None:
            return handler(tx, self, index)
        return super().getitem(tx, index)

    def submodules(self, tx) -> list[VariableTracker]:
        modules_src = _sub(self.source, lambda s: ItemSource(DictOfSource(s), "_modules"))
        mods = self.value.__dict__["_modules"]
        if modules_src is not None:
            tx.output.install_guard(modules_src, GuardKind.TYPE_MATCH, type(mods))
            tx.output.install_guard(modules_src, GuardKind.DICT_KEYS, tuple(mods))
        from ferrodyn.variables.functions import _lazy
        return [_lazy(m, ItemSource(modules_src, k) if modules_src else None)
                for k, m in mods.items()]


def _seq_getitem(tx, mod: NNModuleVariable, index: VariableTracker) -> VariableTracker:
    from ferrodyn.variables.lists import TupleVariable, constant_index
    key = constant_index(index)
    items = mod.submodules(tx)
    try:
        got = items[key]
    except (IndexError, TypeError) as e:
        unsupported(f"{type(mod.value).__name__}[{key!r}]: {e}", BreakReason.EXCEPTION)
    if isinstance(got, list):
        if isinstance(mod.value, torch.nn.Sequential):
            unsupported("slicing an nn.Sequential", BreakReason.UNSUPPORTED_CALL)
        return TupleVariable(items=tuple(got))
    return got


def _named_tensors(dict_name):
    def handler(tx, mod, prefix=None, recurse=None, remove_duplicate=None):
        from ferrodyn.variables.constant import ConstantVariable
        from ferrodyn.variables.lists import IteratorVariable, TupleVariable
        rec = True if recurse is None else recurse.as_python_constant()
        mods = mod.walk(tx) if rec else [("", mod)]
        out, seen = [], set()
        for path, m in mods:
            for k, v in m._children(tx, dict_name):
                if id(v.value) in seen:
                    continue
                seen.add(id(v.value))
                name = f"{path}.{k}" if path else k
                out.append(TupleVariable(items=(ConstantVariable(value=name), v)))
        return IteratorVariable.over(out)
    return handler


def _values(named):
    def handler(tx, mod, *args, **kwargs):
        from ferrodyn.variables.lists import IteratorVariable
        return IteratorVariable.over(t.items[1] for t in named(tx, mod, *args, **kwargs).unpack(tx))
    return handler


def _named_modules(tx, mod, memo=None, prefix=None, remove_duplicate=None):
    from ferrodyn.variables.constant import ConstantVariable
    from ferrodyn.variables.lists import IteratorVariable, TupleVariable
    out, seen = [], set()
    for path, m in mod.walk(tx):
        if id(m.value) in seen:
            continue
        seen.add(id(m.value))
        out.append(TupleVariable(items=(ConstantVariable(value=path), m)))
    return IteratorVariable.over(out)


def _named_children(tx, mod):
    from ferrodyn.variables.constant import ConstantVariable
    from ferrodyn.variables.lists import IteratorVariable, TupleVariable
    return IteratorVariable.over(TupleVariable(items=(ConstantVariable(value=k), v))
                                 for k, v in mod._children(tx, "_modules"))


_TREE_METHODS: dict[str, Callable] = {
    "named_parameters": _named_tensors("_parameters"),
    "named_buffers": _named_tensors("_buffers"),
    "parameters": _values(_named_tensors("_parameters")),
    "buffers": _values(_named_tensors("_buffers")),
    "named_modules": _named_modules,
    "modules": _values(_named_modules),
    "named_children": _named_children,
    "children": _values(_named_children),
}


_GETITEM: dict[Callable, Callable] = {
    torch.nn.ModuleList.__getitem__: _seq_getitem,
    torch.nn.Sequential.__getitem__: _seq_getitem,
}

"""nn.Module instances: attribute reads with Sources that avoid `nn.Module.__getattr__`, and
calls that inline the module's `forward` like any user method.

Owns `NNModuleVariable`: attribute lookup falls back (as `nn.Module.__getattr__` does) to
`_parameters`, `_buffers` and `_modules`, reached as `DictOf(m)['_parameters']['w']`, so a
parameter becomes a lifted graph input guarded by TENSOR_MATCH; module calls inline `forward`
between their forward hooks (module_hooks.py); `Sequential`/`ModuleList` indexing by table.
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
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.nn_module_convert import CONVERSIONS
from ferrodyn.variables.user_objects import UserObjectVariable, _sub

_FALLBACK_DICTS = ("_parameters", "_buffers", "_modules")


@dataclass(frozen=True, eq=False)
class NNModuleVariable(UserObjectVariable):
    def describe(self):
        return f"module {type(self.value).__name__}"

    def fallback_attr(self, tx, name):
        from ferrodyn.variables.nn_module_state import pending_module_dict
        d = self.value.__dict__
        for dict_name in _FALLBACK_DICTS:
            pending = pending_module_dict(tx, self.value, dict_name)
            if pending is not None:  # mutated by this trace: its tracker holds the truth
                if name in pending.state.items:
                    return pending.state.items[name]
                continue
            sub = d.get(dict_name)
            if sub is not None and name in sub:
                src = _sub(self.source, lambda s: ItemSource(ItemSource(DictOfSource(s),
                                                                        dict_name), name))
                from ferrodyn.variables.functions import _lazy
                return _lazy(sub[name], src)
        return None

    def call_function(self, tx, args, kwargs):
        from ferrodyn.variables.module_hooks import call_module, read_hooks
        from ferrodyn.variables.lazy_modules import initialize_lazy_module, needs_initialization
        if needs_initialization(self.value):
            initialize_lazy_module(tx, self, args, kwargs)
        if type(self.value).__call__ is torch.nn.Module.__call__:
            return call_module(tx, self, args, kwargs)
        if read_hooks(tx, self):  # a custom __call__ around hooks is not modelled
            unsupported(f"module {type(self.value).__name__} with hooks and its own __call__",
                        BreakReason.UNSUPPORTED_CALL)
        return super().call_function(tx, args, kwargs)

    # -- mutation: nn.Module.__setattr__ / __delattr__ (nn_module_state.py) ----------------
    def setattr(self, tx, name, value):
        """A plain attribute is stored directly; anything else (a Parameter, Buffer or Module
        value, a name in one of the module's dicts, a class's own `__setattr__`) runs that
        `__setattr__` (torch's code, inlined), which writes into the dict trackers."""
        from ferrodyn.variables.nn_module_state import class_hook, is_plain_store
        if is_plain_store(tx, self, name, value):
            self._plain_slot_check(tx, name)
            self.record_store(tx, name, value)
            return
        tx.realize(class_hook(tx, self, "__setattr__")).call_function(
            tx, [ConstantVariable(value=name), value], {})

    def delattr(self, tx, name):
        from ferrodyn.variables.nn_module_state import class_hook, is_plain_store
        if is_plain_store(tx, self, name, None):
            self._plain_slot_check(tx, name)
            self.record_delete(tx, name)
            return
        tx.realize(class_hook(tx, self, "__delattr__")).call_function(
            tx, [ConstantVariable(value=name)], {})

    def record_store(self, tx, name, value):
        """Every store or deletion of an instance attribute ends here (plain, or `object.
        __setattr__` from a hook): one replacing an internal container is refused."""
        from ferrodyn.variables.nn_module_state import check_internal_store
        check_internal_store(self.value, name)
        super().record_store(tx, name, value)

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
        from ferrodyn.variables.nn_module_state import is_none_tracker, pending_module_dict
        pending = pending_module_dict(tx, self.value, dict_name)
        if pending is not None:  # mutated by this trace: its tracker holds the truth
            return [(k, v) for k, v in pending.state.items.items() if not is_none_tracker(tx, v)]
        d = self.value.__dict__[dict_name]
        src = _sub(self.source, lambda s: ItemSource(DictOfSource(s), dict_name))
        if src is not None:
            tx.output.install_guard(src, GuardKind.DICT_KEYS, tuple(d))
        return [(k, _lazy(v, ItemSource(src, k) if src else None)) for k, v in d.items()
                if v is not None]

    def getitem(self, tx, index):
        handler = _GETITEM.get(type(self.value).__getitem__)
        if handler is not None:
            return handler(tx, self, index)
        return super().getitem(tx, index)

    def submodules(self, tx) -> list[VariableTracker]:
        from ferrodyn.variables.nn_module_state import pending_module_dict
        pending = pending_module_dict(tx, self.value, "_modules")
        if pending is not None:  # mutated by this trace: its tracker holds the truth
            return list(pending.state.items.values())
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


def _bind(tx, fn_name: str, args, kwargs, params: tuple[tuple[str, object], ...]) -> list:
    """Constant values of `nn.Module.<fn_name>`'s parameters (name, default) bound from the
    call's arguments; anything else is refused."""
    from ferrodyn.variables.base import NotConstant
    if len(args) > len(params) or set(kwargs) - {p for p, _ in params}:
        unsupported(f"TypeError: nn.Module.{fn_name}() got unexpected arguments", BreakReason.EXCEPTION)
    values = [d for _, d in params]
    given = dict(zip((p for p, _ in params), args))
    for k, v in kwargs.items():
        if k in given:
            unsupported(f"TypeError: nn.Module.{fn_name}() got multiple values for {k!r}",
                        BreakReason.EXCEPTION)
        given[k] = v
    for i, (p, _) in enumerate(params):
        if p in given:
            try:
                values[i] = tx.realize(given[p]).as_python_constant()
            except NotConstant:
                unsupported(f"nn.Module.{fn_name}({p}=<not a constant>)", BreakReason.UNSUPPORTED_CALL)
    return values


def _join(prefix: str, name: str) -> str:
    return prefix + ("." if prefix else "") + name


def _module_tree(tx, mod, prefix: str, remove_duplicate: bool) -> list[tuple[str, "NNModuleVariable"]]:
    """`nn.Module.named_modules(prefix=..., remove_duplicate=...)`: preorder; a module already
    yielded (with remove_duplicate) is skipped with its subtree."""
    out, memo = [], set()

    def visit(m, path):
        if id(m.value) in memo:
            return
        if remove_duplicate:
            memo.add(id(m.value))
        out.append((path, m))
        for k, child in m._children(tx, "_modules"):
            visit(tx.realize(child), _join(path, k))
    visit(mod, prefix)
    return out


def _named_tensors(dict_name):
    """`named_parameters` / `named_buffers` (`nn.Module._named_members`)."""
    def handler(tx, mod, *args, **kwargs):
        from ferrodyn.variables.constant import ConstantVariable
        from ferrodyn.variables.lists import IteratorVariable, TupleVariable
        from ferrodyn.variables.nn_module_state import object_key
        prefix, recurse, remove_duplicate = _bind(
            tx, f"named{dict_name}", args, kwargs,
            (("prefix", ""), ("recurse", True), ("remove_duplicate", True)))
        mods = _module_tree(tx, mod, prefix, remove_duplicate) if recurse else [(prefix, mod)]
        out, seen = [], set()
        for path, m in mods:
            for k, v in m._children(tx, dict_name):
                if object_key(tx, v) in seen:
                    continue
                if remove_duplicate:
                    seen.add(object_key(tx, v))
                out.append(TupleVariable(items=(ConstantVariable(value=_join(path, k)), v)))
        return IteratorVariable.over(out)
    return handler


def _values(named, params):
    """`parameters(recurse)` / `buffers(recurse)` / `modules()` / `children()`: the values of
    the named variant called with the same (keyword) arguments."""
    def handler(tx, mod, *args, **kwargs):
        from ferrodyn.variables.constant import ConstantVariable
        from ferrodyn.variables.lists import IteratorVariable
        values = _bind(tx, "values", args, kwargs, params)
        kw = {p: ConstantVariable(value=v) for (p, _), v in zip(params, values)}
        return IteratorVariable.over(t.items[1] for t in named(tx, mod, **kw).unpack(tx))
    return handler


def _named_modules(tx, mod, *args, **kwargs):
    from ferrodyn.variables.constant import ConstantVariable
    from ferrodyn.variables.lists import IteratorVariable, TupleVariable
    memo, prefix, remove_duplicate = _bind(tx, "named_modules", args, kwargs,
                                           (("memo", None), ("prefix", ""), ("remove_duplicate", True)))
    if memo is not None:
        unsupported("nn.Module.named_modules(memo=...) (a caller's set is not modelled)",
                    BreakReason.UNSUPPORTED_CALL)
    return IteratorVariable.over(TupleVariable(items=(ConstantVariable(value=path), m))
                                 for path, m in _module_tree(tx, mod, prefix, remove_duplicate))


def _named_children(tx, mod, *args, **kwargs):
    from ferrodyn.variables.nn_module_state import object_key
    from ferrodyn.variables.constant import ConstantVariable
    from ferrodyn.variables.lists import IteratorVariable, TupleVariable
    _bind(tx, "named_children", args, kwargs, ())
    out, seen = [], set()
    for k, v in mod._children(tx, "_modules"):
        if object_key(tx, v) not in seen:
            seen.add(object_key(tx, v))
            out.append(TupleVariable(items=(ConstantVariable(value=k), v)))
    return IteratorVariable.over(out)


_TREE_METHODS: dict[str, Callable] = {
    "named_parameters": _named_tensors("_parameters"),
    "named_buffers": _named_tensors("_buffers"),
    "parameters": _values(_named_tensors("_parameters"), (("recurse", True),)),
    "buffers": _values(_named_tensors("_buffers"), (("recurse", True),)),
    "named_modules": _named_modules,
    "modules": _values(_named_modules, ()),
    "named_children": _named_children,
    "children": _values(_named_children, ()),
    **CONVERSIONS,  # .to() / .float() / ... as no-ops (nn_module_convert.py)
}


_GETITEM: dict[Callable, Callable] = {
    torch.nn.ModuleList.__getitem__: _seq_getitem,
    torch.nn.Sequential.__getitem__: _seq_getitem,
}

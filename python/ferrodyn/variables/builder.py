"""The one way to make a tracker from a real value: `build(tx, value, source)`.

Owns the type dispatch table (value type -> tracker) and the guards a value needs when the
trace uses it (the translator calls `build` lazily, when a value reaches the stack, so nothing
is guarded eagerly): TENSOR_MATCH for tensors (which become lifted graph inputs), TYPE_MATCH +
EQUALS for constants, NONE for None, ID_MATCH for functions/classes/modules, TYPE_MATCH +
LENGTH for lists and tuples, TYPE_MATCH + DICT_KEYS for dicts, TYPE_MATCH for objects and
modules. Trackers built from one Source are cached on the output graph; mutable values (lists,
dicts, sets, objects, modules, tensors) are also keyed by object identity in the SideEffects
table, so one object reached through two Sources is one tracker (one state, one graph input;
the aliasing guard then pins the relation). Containers from the frame are EXISTING
(side_effects.MutationType): their mutations are recorded and replayed. `build_unsourced`
wraps values with no Source (torch internals, folded constants): no guards, and tensors are
refused (they could not be loaded as graph inputs).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import enum
import gc
import logging
import operator
import types
from typing import Any

import numpy as np
import torch

from ferrodyn import resume
from ferrodyn.exc import BreakReason
from ferrodyn.guard_spec import GuardKind
from ferrodyn.side_effects import MutationType
from ferrodyn.source import AttrSource, ItemSource, Source
from ferrodyn.variables.base import LazyVariable, VariableTracker, unsupported
from ferrodyn.variables.builtins import BuiltinVariable, is_builtin_like
from ferrodyn.variables.constant import ConstantVariable, is_constant_value
from ferrodyn.variables.dicts import DictState, DictVariable
from ferrodyn.variables.functions import UserFunctionVariable, BoundMethodVariable, build_cell
from ferrodyn.variables.lists import ListState, ListVariable, TupleVariable
from ferrodyn.variables.nn_module import NNModuleVariable
from ferrodyn.variables.numpy_vars import build_numpy, build_numpy_unsourced, is_numpy_value
from ferrodyn.variables.tensor import TensorVariable
from ferrodyn.variables.torch_fns import TorchFunctionVariable, is_torch_callable
from ferrodyn.variables.py_modules import PythonModuleVariable
from ferrodyn.variables.namedtuple_vars import NamedTupleVariable
from ferrodyn.variables.user_objects import (
    ClassVariable, UserObjectVariable, is_identity_hashed, is_namedtuple_class, is_slots_class,
)

_SCALARS = (bool, int, float, str, bytes, complex)


def build(tx, value: Any, source: Source | None) -> VariableTracker:
    if source is None:
        return build_unsourced(value)
    cache = tx.output.source_cache
    hit = cache.get(source)
    if hit is not None:
        return hit
    table = tx.output.side_effects
    identity_keyed = _is_identity_keyed(value)
    if identity_keyed:
        hit = table.tracked(value, source)
        if hit is not None:
            cache[source] = hit
            return hit
    var = _build(tx, value, source)
    cache[source] = var
    if identity_keyed:
        table.track(value, source, var)
    return var


_IDENTITY_KEYED = (list, dict, set, collections.OrderedDict, collections.defaultdict)


def _is_identity_keyed(value: Any) -> bool:
    t = type(value)
    if t in _IDENTITY_KEYED or isinstance(value, (torch.Tensor, torch.nn.Module, np.ndarray)):
        return True
    if t is types.FunctionType and _made_per_call(value):
        return True  # guarded by code, not identity: `is` is answered by the aliasing guard
    return (_has_instance_dict(value) and isinstance(t, type) and t.__module__ != "builtins"
            and not isinstance(value, (type, types.FunctionType, types.ModuleType,
                                       types.MethodType))) or is_slots_class(t)


def _generic_getattr(value: Any, name: str) -> Any:
    """`getattr(value, name, None)` without the value's own `__getattr__`/`__getattribute__`
    (user code that may raise anything, or answer every name: `KeyError` from a config class's
    `__getattr__` is not "no such attribute")."""
    try:
        return object.__getattribute__(value, name)
    except AttributeError:
        return None


def _has_instance_dict(value: Any) -> bool:
    """`hasattr(value, "__dict__")` without running user code and without making the dict
    (reading `obj.__dict__` creates it, which changes CPython's behaviour: a partial with a
    `__dict__` is no longer flattened into `partial(p, ...)`)."""
    return getattr(type(value), "__dictoffset__", 0) != 0


def _existing(tx, source, **kw) -> dict:
    """State fields of a container reached from the frame."""
    return dict(mutation_type=MutationType.EXISTING, side_effects=tx.output.side_effects,
                source=source, **kw)


def _guard(tx, source, kind, payload=None):
    tx.output.install_guard(source, kind, payload)


def _build(tx, value: Any, source: Source) -> VariableTracker:
    t = type(value)
    if isinstance(value, torch.Tensor):
        if t not in (torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.Tensor)) and \
                not isinstance(value, torch.nn.Parameter):
            unsupported(f"tensor subclass {t.__name__} at {source.name()}",
                        BreakReason.UNSUPPORTED_TYPE)
        node, fake = tx.output.add_graph_input(source, value)
        _guard(tx, source, GuardKind.TENSOR_MATCH, value)
        return TensorVariable(source=source, node=node, example=fake, cls=t)
    if value is None:
        _guard(tx, source, GuardKind.NONE)
        return ConstantVariable(source=source, value=None)
    if is_numpy_value(value):  # ndarrays, numpy scalars, dtypes, numpy functions
        var = build_numpy(tx, value, source)
        if var is not None:
            return var
    if t is int:  # a dynamic int (dynamic.py decides) is a SymInt graph input
        from ferrodyn.variables.sym_int import maybe_symint_input
        var = maybe_symint_input(tx, value, source)
        if var is not None:
            return var
    if t in _SCALARS:
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        _guard(tx, source, GuardKind.EQUALS, value)
        return ConstantVariable(source=source, value=value)
    if t in (set, frozenset):
        from ferrodyn.variables.sets import build_set
        return build_set(tx, value, source, _existing(tx, source, obj=value))
    if t in (torch.no_grad, torch.enable_grad, torch.set_grad_enabled):
        from ferrodyn.variables.ctx_managers import build_grad_ctx
        var = build_grad_ctx(tx, value, source, _guard)
        if var is not None:
            return var
    if isinstance(value, enum.Enum) or t in (torch.dtype, torch.layout, torch.memory_format) or \
            value is Ellipsis or t is torch.nn.attention.SDPBackend:  # a pybind enum's singletons
        _guard(tx, source, GuardKind.ID_MATCH, value)
        return ConstantVariable(source=source, value=value)
    if t is slice and is_constant_value(value):
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        for part in ("start", "stop", "step"):  # slices are unhashable before 3.12
            build(tx, getattr(value, part), AttrSource(source, part))
        return ConstantVariable(source=source, value=value)
    if t in _PARTS and is_constant_value(value):
        # Not expressible as one EQUALS payload (the leaf holds exact builtin constants):
        # the type, then each part that defines the value, read back from the object.
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        parts = _PARTS[t](value)
        if t is torch.Size:
            _guard(tx, source, GuardKind.LENGTH, len(value))
        for key, part in parts:
            part_source = ItemSource(source, key) if isinstance(key, int) else AttrSource(source, key)
            _guard(tx, part_source, GuardKind.TYPE_MATCH, type(part))
            _guard(tx, part_source, GuardKind.NONE if part is None else GuardKind.EQUALS, part)
        return ConstantVariable(source=source, value=value)
    if t is tuple:
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        _guard(tx, source, GuardKind.LENGTH, len(value))
        return TupleVariable(source=source, items=_lazy_items(value, source))
    if t is list:
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        _guard(tx, source, GuardKind.LENGTH, len(value))
        return ListVariable(source=source, state=ListState(list(_lazy_items(value, source)),
                                                           **_existing(tx, source, obj=value)))
    if is_namedtuple_class(t):
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        from ferrodyn.variables.namedtuple_vars import item_sources  # past a user __getitem__
        slots = [tuple.__getitem__(value, i) for i in range(tuple.__len__(value))]
        return NamedTupleVariable.make(t, tuple(LazyVariable(source=s, value=v) for s, v in
                                                zip(item_sources(t, source, len(slots)), slots)),
                                       source=source)
    if t is collections.defaultdict:  # read by position: a guard's `d[k]` could run __missing__
        from ferrodyn.variables.dict_keys import build_object_keyed_dict
        return build_object_keyed_dict(tx, value, source, _existing(tx, source, cls=t, obj=value))
    if t in (dict, collections.OrderedDict):
        if tx.output.side_effects.is_written_instance_dict(value):
            unsupported(f"{source.name()}: the __dict__ of an object whose attributes were "
                        f"assigned in this frame", BreakReason.SIDE_EFFECT)
        keys = tuple(value)
        if not all(is_constant_value(k) or is_identity_hashed(k) for k in keys):
            from ferrodyn.variables.dict_keys import build_object_keyed_dict  # tensor keys
            return build_object_keyed_dict(tx, value, source,
                                           _existing(tx, source, cls=t, obj=value))
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        items = {k: LazyVariable(source=ItemSource(source, k), value=v) for k, v in value.items()}
        # the key set is guarded when the trace reads it (one key's lookup guards that key)
        keys_guard = functools.partial(_guard, tx, source, GuardKind.DICT_KEYS, keys)
        return DictVariable(source=source, state=DictState(items, **_existing(
            tx, source, cls=t, obj=value, keys_guard=keys_guard)))
    if isinstance(value, torch.nn.Module):
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        return NNModuleVariable(source=source, value=value)
    if isinstance(value, types.MethodType):
        return BoundMethodVariable(source=source,
                                   func=LazyVariable(source=AttrSource(source, "__func__"),
                                                     value=value.__func__),
                                   obj=LazyVariable(source=AttrSource(source, "__self__"),
                                                    value=value.__self__))
    if t is types.BuiltinMethodType and type(value.__self__) in (list, dict, set) \
            and not value.__name__.startswith("__"):  # `xs.append` handed to a resume function
        from ferrodyn.variables.functions import MethodOf
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        _guard(tx, AttrSource(source, "__name__"), GuardKind.EQUALS, value.__name__)
        return BoundMethodVariable(source=source, func=MethodOf(name=value.__name__),
                                   obj=tx.realize(LazyVariable(source=AttrSource(source, "__self__"),
                                                               value=value.__self__)))
    if t is functools.partial:
        from ferrodyn.variables.functions import PartialVariable
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        args_src, kw_src = AttrSource(source, "args"), AttrSource(source, "keywords")
        _guard(tx, args_src, GuardKind.LENGTH, len(value.args))
        _guard(tx, kw_src, GuardKind.DICT_KEYS, tuple(value.keywords))
        return PartialVariable(
            source=source, func=LazyVariable(source=AttrSource(source, "func"), value=value.func),
            args=tuple(LazyVariable(source=ItemSource(args_src, i), value=v)
                       for i, v in enumerate(value.args)),
            keywords=LazyVariable(source=kw_src, value=value.keywords))
    var = _build_constant_object(value, source)
    if isinstance(var, UserFunctionVariable) and _made_per_call(value):
        return _closure_by_code(tx, var, value, source)
    if var is not None:
        _guard(tx, source, GuardKind.ID_MATCH, value)
        if isinstance(var, UserFunctionVariable):
            # `fn.__code__` is writable: the same function object can run other code later
            _guard(tx, AttrSource(source, "__code__"), GuardKind.ID_MATCH, value.__code__)
        return var
    var = _build_object_model(tx, value, source)
    if var is not None:
        return var
    if _has_instance_dict(value) and isinstance(t, type) and t.__module__ != "builtins" or \
            is_slots_class(t):
        _guard(tx, source, GuardKind.TYPE_MATCH, t)
        return UserObjectVariable(source=source, value=value)
    from ferrodyn.variables.functions import OpaqueVariable
    _guard(tx, source, GuardKind.TYPE_MATCH, t)
    return OpaqueVariable(source=source, value=value)


def _made_per_call(fn: types.FunctionType) -> bool:
    """A function made by each call of an enclosing function (a closure, a nested def or
    lambda): many objects of one code, so guarded by code (`_closure_by_code`)."""
    return bool(fn.__closure__) or "<locals>" in fn.__code__.co_qualname


def _closure_by_code(tx, var, fn, source):
    """A function made per call (`_made_per_call`: a closure, a nested def or lambda, e.g. one
    defined in the frame and handed to a resume function after a graph break, or a lambda in a
    partial from the caller) is guarded by what the trace reads of it, not by identity: its code,
    globals and the shape of its defaults (their values and the cells' contents are guarded
    through their Sources when used). Its identity is never baked in (`by_code`)."""
    _guard(tx, source, GuardKind.TYPE_MATCH, types.FunctionType)
    _guard(tx, AttrSource(source, "__code__"), GuardKind.ID_MATCH, fn.__code__)
    _guard(tx, AttrSource(source, "__globals__"), GuardKind.ID_MATCH, fn.__globals__)
    defaults, kwdefaults = AttrSource(source, "__defaults__"), AttrSource(source, "__kwdefaults__")
    if fn.__defaults__ is None:
        _guard(tx, defaults, GuardKind.NONE)
    else:
        _guard(tx, defaults, GuardKind.TYPE_MATCH, tuple)
        _guard(tx, defaults, GuardKind.LENGTH, len(fn.__defaults__))
    if fn.__kwdefaults__ is None:
        _guard(tx, kwdefaults, GuardKind.NONE)
    else:
        _guard(tx, kwdefaults, GuardKind.TYPE_MATCH, dict)
        _guard(tx, kwdefaults, GuardKind.DICT_KEYS, tuple(fn.__kwdefaults__))
    return dataclasses.replace(var, by_code=True)


# ---- object-model types (objmodel): type -> builder(tx, value, source) or None ---------------

def _build_getter(tx, value, source):
    from ferrodyn.variables.functools_vars import from_frame_value
    var = from_frame_value(value, source)
    if var is not None:
        _guard(tx, source, GuardKind.ID_MATCH, value)
    return var


def _build_mappingproxy(tx, value, source):
    """A class `__dict__` (or any mappingproxy) of constant keys: read-only, items lazy. The
    tracker is a snapshot of the proxied dict: a frame that also changes that dict (through
    another name, attribute or class-attribute stores) is refused, now or when it does."""
    keys = tuple(value)
    if not all(is_constant_value(k) for k in keys):
        return None
    target = gc.get_referents(value)  # a mappingproxy refers to exactly its mapping
    side_effects = tx.output.side_effects
    if len(target) == 1 and isinstance(side_effects.tracked(target[0], None), DictVariable):
        # its dict is already a tracker (reached through another Source): a live view of it
        from ferrodyn.variables.dict_views import MappingProxyVariable
        _guard(tx, source, GuardKind.ID_MATCH, value)  # the proxy object pins its mapping
        return MappingProxyVariable(source=source, dict_var=side_effects.tracked(target[0], None))

    def check_not_mutated():
        if len(target) != 1 or side_effects.mutated_mapping(target[0]):
            unsupported(f"{source.name()}: a mappingproxy over a dict this frame changes (two "
                        f"views of one dict are not modelled)", BreakReason.SIDE_EFFECT)
    check_not_mutated()
    side_effects.checks.append(check_not_mutated)
    _guard(tx, source, GuardKind.TYPE_MATCH, type(value))
    _guard(tx, source, GuardKind.DICT_KEYS, keys)
    items = {k: LazyVariable(source=ItemSource(source, k), value=v) for k, v in value.items()}
    state = DictState(items, MutationType.EXISTING, cls=type(value), read_only=True, source=source,
                      obj=value)
    return DictVariable(source=source, state=state)


def _build_lru_wrapper(tx, value, source):
    from ferrodyn.variables.functools_vars import build_lru_wrapper
    return build_lru_wrapper(tx, value, source)


def _build_union_type(tx, value, source):
    from ferrodyn.variables.typing_vars import build_union_type
    return build_union_type(tx, value, source)


_OBJECT_MODEL_BUILDERS = {
    operator.itemgetter: _build_getter, operator.attrgetter: _build_getter,
    types.MappingProxyType: _build_mappingproxy,
    resume.LoopRest: resume.build_loop_rest,  # a for loop's iterator handed to a resume function
    resume.LiveRest: resume.build_live_rest,  # the same, over a live list (resume/live_rest.py)
    functools._lru_cache_wrapper: _build_lru_wrapper,
    types.CellType: build_cell,  # a resume function takes the cells of the frame it continues
    types.UnionType: _build_union_type,  # `int | None`
}


def _build_object_model(tx, value, source) -> VariableTracker | None:
    if isinstance(value, logging.Logger):
        from ferrodyn.variables.logging_vars import build_logger
        return build_logger(tx, value, source)
    builder = _OBJECT_MODEL_BUILDERS.get(type(value))
    return builder(tx, value, source) if builder is not None else None


# Constant values guarded through their parts: (item index or attribute name, value) pairs.
_PARTS = {
    torch.Size: lambda v: list(enumerate(v)),
    range: lambda v: [("start", v.start), ("stop", v.stop), ("step", v.step)],
    torch.device: lambda v: [("type", v.type), ("index", v.index)],
}


def _lazy_items(value, source) -> tuple:
    return tuple(LazyVariable(source=ItemSource(source, i), value=v) for i, v in enumerate(value))


def _build_constant_object(value: Any, source: Source | None) -> VariableTracker | None:
    """Functions, classes, modules, builtins: objects identified by identity."""
    if type(value) is types.BuiltinMethodType:  # a stored `Cls.apply` of an autograd Function
        from ferrodyn.variables.autograd_function import build_apply
        var = build_apply(value, source)
        if var is not None:
            return var
    if is_builtin_like(value):
        return BuiltinVariable(source=source, fn=value)
    if _generic_getattr(value, "__objclass__") in (torch._C.TensorBase, torch.Tensor):
        return TorchFunctionVariable(source=source, fn=value)
    if isinstance(value, types.FunctionType):
        if is_torch_callable(value) and not _is_torch_user_code(value):
            return TorchFunctionVariable(source=source, fn=value)
        return UserFunctionVariable(source=source, fn=value)
    if isinstance(value, types.ModuleType):
        return PythonModuleVariable(source=source, value=value)
    if isinstance(value, type):
        if is_builtin_like(value) or value.__module__ == "builtins":
            return BuiltinVariable(source=source, fn=value)
        if is_torch_callable(value) and not issubclass(value, torch.nn.Module):
            return TorchFunctionVariable(source=source, fn=value)
        from ferrodyn.variables.namedtuple_vars import tracker_of
        made = tracker_of(value) if source is None else None  # a namedtuple made by the trace
        return made if made is not None else ClassVariable(source=source, value=value)
    if callable(value) and is_torch_callable(value):
        return TorchFunctionVariable(source=source, fn=value)
    return None


# Python functions inside torch that are user-level code to inline rather than graph ops
# (they take modules or callables).
_TORCH_INLINE_MODULES = ("torch.nn.modules.", "torch.utils._contextlib")


def _is_torch_user_code(fn: types.FunctionType) -> bool:
    return fn.__module__.startswith(_TORCH_INLINE_MODULES)


def build_unsourced(value: Any) -> VariableTracker:
    if is_constant_value(value):
        return ConstantVariable(value=value)
    if isinstance(value, torch.Tensor):
        unsupported("a tensor that cannot be reached from the frame (no source)",
                    BreakReason.UNSUPPORTED_TYPE)
    if type(value) is tuple:
        return TupleVariable(items=tuple(build_unsourced(v) for v in value))
    if type(value) is list:
        return ListVariable.new(build_unsourced(v) for v in value)
    if is_namedtuple_class(type(value)):
        return NamedTupleVariable.make(type(value), [build_unsourced(v) for v in value])
    if is_numpy_value(value):
        var = build_numpy_unsourced(value)
        if var is not None:
            return var
    var = _build_constant_object(value, None)
    if var is not None:
        return var
    if type(value) is functools._lru_cache_wrapper:
        from ferrodyn.variables.functools_vars import LruCacheVariable
        return LruCacheVariable(value=value)
    if isinstance(value, types.MethodType):
        return BoundMethodVariable(func=build_unsourced(value.__func__),
                                   obj=build_unsourced(value.__self__))
    if isinstance(value, torch.nn.Module):
        return NNModuleVariable(value=value)
    if _has_instance_dict(value) and type(value).__module__ != "builtins":
        return UserObjectVariable(value=value)
    unsupported(f"value of type {type(value).__name__}", BreakReason.UNSUPPORTED_TYPE)

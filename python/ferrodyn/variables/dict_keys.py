"""Dict keys that are not Python constants: how a dict tracker holds them, compares them and
rebuilds them.

Owns the key model of `DictState.items` beyond constants (which are their own keys):
- tensors and objects whose class keeps `object.__hash__`/`object.__eq__` (new objects made in
  the frame, nn.Parameters, ...) are `set_model.IdKey`s: CPython hashes them by `id` and
  compares identity first, so two keys are equal exactly when they are the same object; such a
  key makes the trace identity-sensitive (the aliasing guard pins which inputs are which);
- instances of frozen dataclasses whose `__eq__`/`__hash__` are the ones `dataclasses`
  generated (checked against a reference class with the same fields) are `DataclassKey`s: equal
  exactly when of the same class with equal compared fields (constants read through the
  tracker, so fields of objects from the frame are guarded);
- anything else (a user `__hash__`/`__eq__`, a mutable dataclass) is refused.
A key object remembers the tracker that was inserted first (CPython keeps the first key object
of equal keys), so iteration hands back that tracker (`key_var`) and rebuilding a dict
reconstructs it (`key_out`). Also owns how a dict from the frame with such keys (and any
defaultdict from the frame) is built and guarded: by position (`build_object_keyed_dict`).
Does not own constant keys' hashing or object keys reached from the frame by identity
(`dicts.dict_key`, `user_objects.identity_dict_key`), or the dict trackers (dicts.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.trace_result import Out, OutConst, OutTuple
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.set_model import IdKey


class DataclassKey:
    """The key of a frozen dataclass instance with generated `__eq__`/`__hash__`."""

    __slots__ = ("cls", "eq_values", "hash_values", "var")

    def __init__(self, cls: type, eq_values: tuple, hash_values: tuple, var: VariableTracker):
        self.cls, self.eq_values, self.hash_values, self.var = cls, eq_values, hash_values, var

    def __hash__(self) -> int:
        return hash(self.hash_values)

    def __eq__(self, other: Any) -> Any:
        if not isinstance(other, DataclassKey):
            return NotImplemented  # generated __eq__: NotImplemented for another class
        return other.cls is self.cls and self.eq_values == other.eq_values

    def __repr__(self) -> str:
        return f"{self.cls.__name__}{self.eq_values!r}"


TRACKED_KEYS = (IdKey, DataclassKey)


def is_tracked(key: Any) -> bool:
    return isinstance(key, TRACKED_KEYS)


def tracked_key(tx, v: VariableTracker) -> Any:
    """The key of non-constant `v` (a tensor, an identity-hashed new object, a frozen
    dataclass instance), or None when `v` is none of these."""
    from ferrodyn.variables.tensor import TensorVariable
    from ferrodyn.variables.user_objects import NewObjectVariable, UserObjectVariable
    if isinstance(v, TensorVariable):
        tx.output.side_effects.identity_sensitive = True
        return IdKey(v.identity(), v)
    if not isinstance(v, (NewObjectVariable, UserObjectVariable)):
        return None
    cls = v.obj_type()
    if cls.__hash__ is object.__hash__ and cls.__eq__ is object.__eq__:
        if isinstance(v, UserObjectVariable):
            return None  # keyed by the object itself (user_objects.identity_dict_key)
        tx.output.side_effects.identity_sensitive = True
        return IdKey(v.identity(), v)
    spec = _generated_eq_hash(cls)
    if spec is None:
        unsupported(f"a {cls.__name__} object as a dict key: its __hash__/__eq__ are user code",
                    BreakReason.UNSUPPORTED_TYPE)
    eq_names, hash_names = spec
    values = {n: _field_constant(tx, v, cls, n) for n in {*eq_names, *hash_names}}
    return DataclassKey(cls, tuple(values[n] for n in eq_names),
                        tuple(values[n] for n in hash_names), v)


def _field_constant(tx, v, cls, name):
    from ferrodyn.variables.base import NotConstant
    field = tx.realize(v.var_getattr(tx, name))
    try:
        value = field.as_python_constant()
        hash(value)
    except (NotConstant, TypeError):
        unsupported(f"a {cls.__name__} dict key whose field {name!r} is {field.describe()}",
                    BreakReason.UNSUPPORTED_TYPE)
    if isinstance(value, float) and math.isnan(value):  # 3.13 compares fields one by one
        unsupported(f"a {cls.__name__} dict key with a NaN field", BreakReason.UNSUPPORTED_TYPE)
    return value


@functools.lru_cache(maxsize=256)
def _generated_eq_hash(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(fields compared by `__eq__`, fields hashed by `__hash__`) when `cls`'s `__eq__` and
    `__hash__` are those `dataclasses` generates for a frozen dataclass (same code as a
    reference class with the same fields), else None."""
    owner = next((k for k in cls.__mro__ if "__eq__" in vars(k)), None)
    params = vars(owner).get("__dataclass_params__") if owner is not None else None
    if params is None or not params.eq or not params.frozen or "__hash__" not in vars(owner):
        return None
    fields = dataclasses.fields(owner)
    ref = dataclasses.make_dataclass(
        owner.__name__, [(f.name, object, dataclasses.field(compare=f.compare, hash=f.hash))
                         for f in fields], eq=True, frozen=True)
    for name in ("__eq__", "__hash__"):
        mine, theirs = vars(owner)[name], vars(ref)[name]
        if not isinstance(mine, types.FunctionType) or not _same_code(mine.__code__,
                                                                     theirs.__code__):
            return None
    eq_names = tuple(f.name for f in fields if f.compare)
    hash_names = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
    return eq_names, hash_names


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    return (a.co_code, a.co_names, a.co_consts, a.co_varnames) == \
        (b.co_code, b.co_names, b.co_consts, b.co_varnames)


def build_object_keyed_dict(tx, value: dict, source, existing: dict) -> VariableTracker:
    """A dict from the frame with keys that are not constants (tensors, parameters), or any
    defaultdict from the frame: its type and length guarded, then each key reached by position
    (`list(d)[i]`) and built like any input (a tensor key is a graph input; its identity
    relations to other inputs are pinned by the aliasing guard), each value reached by position
    too (`list(d.values())[i]`: no guard or entry holds a key object, and a defaultdict's
    `d[k]`, which would run `__missing__` for a key that has gone, is never read by a guard).
    Exact dicts and defaultdicts only (the positional reads walk dict storage); a defaultdict's
    factory is read through `default_factory` when used."""
    import collections
    from ferrodyn.guard_spec import GuardKind
    from ferrodyn.source import AttrSource, DictValueSource, SetItemSource
    from ferrodyn.variables.base import LazyVariable
    from ferrodyn.variables.builder import build
    from ferrodyn.variables.dicts import DictState, DictVariable, dict_key
    t = type(value)
    if t not in (dict, collections.defaultdict):
        unsupported(f"a {t.__name__} with tensor or object keys at {source.name()}",
                    BreakReason.UNSUPPORTED_TYPE)
    if t is collections.defaultdict:
        existing = dict(existing, default_factory=LazyVariable(
            source=AttrSource(source, "default_factory"), value=value.default_factory))
    tx.output.install_guard(source, GuardKind.TYPE_MATCH, t)
    tx.output.install_guard(source, GuardKind.LENGTH, len(value))
    items = {}
    for i, (k, v) in enumerate(value.items()):
        key = dict_key(tx, build(tx, k, SetItemSource(source, i)))
        items[key] = LazyVariable(source=DictValueSource(source, i), value=v)
    return DictVariable(source=source, state=DictState(items, **existing))


def key_var(key: Any) -> VariableTracker | None:
    """The tracker of a tracked key (None for constant keys)."""
    return key.var if is_tracked(key) else None


def key_out(tx, key: Any) -> Out:
    var = key_var(key)
    return OutConst(key) if var is None else tx.realize(var).reconstruct(tx)


def keys_out(tx, keys) -> Out:
    """The keys of a dict to rebuild: one constant tuple when every key is its own value."""
    keys = tuple(keys)
    if not any(is_tracked(k) for k in keys):
        return OutConst(keys)
    return OutTuple(tuple(key_out(tx, k) for k in keys))

"""The model behind set trackers (sets.py): element keys, and how a set is rebuilt at run time
so that it iterates as eager's object does.

Owns:
- keys: constants and identity-pinned objects (functions, classes, builtins, modules) are their
  own keys (*stable*: they hash as at run time); tensors, user objects and nn.Modules whose
  class keeps `object.__hash__`/`object.__eq__` are `IdKey`s, equal only to a key of the same
  object (CPython compares identity first, and two live objects never share an identity hash,
  so no `__eq__` runs); anything whose hashing would run user code is refused.
- rebuild recipes (`recipe`, `recipe_out`, `rebuild_grown`): a set's iteration order depends
  on its history (table size, collisions, deletions), so a set made in the frame is rebuilt by
  repeating an insertion-only history, or by a candidate construction checked at trace time
  on the same stable keys to iterate in the model's order; otherwise the caller refuses.
Does not own the trackers, their methods or guards (sets.py).
"""

from __future__ import annotations

import itertools
import types
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.trace_result import OutCall, OutConst, OutTuple
from ferrodyn.variables.base import NotConstant, VariableTracker, unsupported
from ferrodyn.variables.constant import fold, is_constant_value

class IdKey:
    """The key of an identity-hashed object in a set model: equal only to the same object."""

    __slots__ = ("ident", "var", "_hash")

    def __init__(self, ident: Any, var: VariableTracker):
        self.ident = ident
        self.var = var
        self._hash = hash(ident) if isinstance(ident, tuple) else id(ident)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> Any:
        if not isinstance(other, IdKey):
            return NotImplemented
        if isinstance(self.ident, tuple) or isinstance(other.ident, tuple):
            return self.ident == other.ident
        return self.ident is other.ident

    def __repr__(self) -> str:
        return f"<{self.var.describe()}>"


_IDENTITY_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                   types.MethodDescriptorType, types.WrapperDescriptorType)


def _hash_is_identity(cls: type) -> bool:
    return getattr(cls, "__hash__", None) is object.__hash__ and cls.__eq__ is object.__eq__


def _hash_safe(value: Any) -> bool:
    """Whether hashing/comparing `value` runs no user code and gives its run-time hash."""
    if is_constant_value(value):
        return True
    if type(value) in (tuple, frozenset):
        return all(_hash_safe(v) for v in value)
    if isinstance(value, type):
        return _hash_is_identity(type(value))
    return isinstance(value, _IDENTITY_TYPES)


def key_of(tx, v: VariableTracker) -> Any:
    """The model key of set element `v` (refuses what the model cannot hash exactly)."""
    v = tx.realize(v)
    from ferrodyn.variables.sets import SetVariable
    if isinstance(v, SetVariable):
        if v.state.frozen and v.stable_constant():
            return frozenset(v.state.real)
        if not v.state.frozen:
            unsupported("unhashable type: 'set'", BreakReason.EXCEPTION)
        unsupported(f"a {v.describe()} of tensors or objects as a set element",
                    BreakReason.UNSUPPORTED_TYPE)
    try:
        value = v.as_python_constant()
    except NotConstant:
        value = _NOT_CONSTANT
    if value is not _NOT_CONSTANT:
        fold(hash, value)  # unhashable: eager raises TypeError
        if _hash_safe(value):
            return value
        unsupported(f"set element {v.describe()}: hashing it runs user code",
                    BreakReason.UNSUPPORTED_TYPE)
    from ferrodyn.variables.tensor import TensorVariable
    from ferrodyn.variables.user_objects import NewObjectVariable, UserObjectVariable
    if isinstance(v, TensorVariable):
        return IdKey(v.identity(), v)
    if isinstance(v, (UserObjectVariable, NewObjectVariable)):
        cls = v.obj_type()
        if _hash_is_identity(cls):
            return IdKey(v.identity(), v)
        unsupported(f"set element of class {cls.__name__}, which defines __hash__ or __eq__",
                    BreakReason.UNSUPPORTED_TYPE)
    unsupported(f"set element {v.describe()}", BreakReason.UNSUPPORTED_TYPE)


_NOT_CONSTANT = object()


def var_of(key: Any) -> VariableTracker:
    if isinstance(key, IdKey):
        return key.var
    from ferrodyn.variables.builder import build_unsourced
    return build_unsourced(key)


def note_identity(tx, keys) -> None:
    """A membership answer that depends on which objects are which is pinned by the
    aliasing guard over every Source the trace reached."""
    if any(isinstance(k, IdKey) for k in keys):
        tx.output.side_effects.identity_sensitive = True



def recipe(keys: set, inserted: dict | None, order_known: bool, frozen: bool,
            order: list | None = None) -> tuple | None:
    """How to make, at run time, a set (frozenset) that iterates like the model `keys`
    (`order`: the object's order when the model's layout is not the object's), or None:
    ("tuple", keys) for `cls(tuple)` when the history was only insertions (run time repeats
    it) or when that gives the order; ("template", set) for `cls(template)`, a copy held by
    the entry; ("grown", keys, fillers) for `rebuild_grown`. Every candidate is checked here on
    the same keys (stable keys hash as at run time)."""
    cls = frozenset if frozen else set
    if inserted is not None:
        return ("tuple", [k for k in inserted if k in keys], frozen)
    want = order if order is not None else list(keys)
    if len(want) <= 1:
        return ("tuple", want, frozen)
    if any(isinstance(k, IdKey) for k in want) or (order is None and not order_known):
        return None
    template = set(want)
    if list(cls(template)) == want:
        return ("template", template, frozen)
    # Insertion orders into tables grown by fillers (added before or after the keys, then
    # removed): the object's table may be bigger than a fresh one, and its keys may have
    # collided in another order.
    orders = [want, want[::-1]]
    if len(want) <= 5:
        orders += [list(p) for p in itertools.permutations(want)]
    for n in _FILLER_COUNTS:
        fillers = tuple(range(_FILLER_BASE, _FILLER_BASE + n))
        if template.intersection(fillers):
            continue
        for first in (False, True):
            for order in orders:
                if list(rebuild_grown(tuple(order), fillers, frozen, first)) == want:
                    if not fillers:
                        return ("tuple", order, frozen)
                    return ("grown", order, frozen, fillers, first)
    return None


def recipe_out(tx, recipe: tuple):
    from ferrodyn.side_effects import value_out
    kind, keys, frozen = recipe[:3]
    cls = frozenset if frozen else set
    if kind == "template":
        return OutCall(cls, (OutConst(keys),))
    outs = OutTuple(tuple(value_out(tx, var_of(k)) for k in keys))
    if kind == "tuple":
        return OutCall(cls, (outs,))
    return OutCall(rebuild_grown, (outs, OutConst(recipe[3]), OutConst(frozen),
                                   OutConst(recipe[4])))


_FILLER_BASE = -(2 ** 40)
_FILLER_COUNTS = (0, 2, 4, 8, 16, 32, 64, 128, 256)


def rebuild_grown(keys: tuple, fillers: tuple, frozen: bool, first: bool):
    """A set of `keys` (inserted in this order) whose table was grown by `fillers` (added
    before the keys when `first`, else after), then rid of them (called by entries to rebuild
    a set whose order depends on its history)."""
    s = set(fillers) if first else set()
    s.update(keys)
    s.update(fillers)
    s.difference_update(fillers)
    return frozenset(s) if frozen else s

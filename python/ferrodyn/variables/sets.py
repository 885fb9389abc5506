"""Set trackers: `set` and `frozenset` of any hashable the converter can model exactly.

Owns `SetVariable` (a set or, `frozen`, a frozenset), its methods and operators, and sets read
from the frame (`build_set`). The model is a real Python set of keys (set_model.py) that
replays the program's operations, so membership and size are eager's, and so is iteration
order where it is knowable; where it is not, iteration and `pop` are refused:
- a set made in the frame iterates in the model's order when every key is stable and the model
  replayed the whole history (`order_known`); a set of tensors or objects (their run-time
  addresses decide the order) iterates only with one element;
- a set from the frame iterates positionally (each element reached through `SetItemSource`,
  guarded on its position) while the frame has not mutated it.
Sets from the frame are EXISTING: mutations (`add`, `discard`, `remove`, `pop` of one
element, `clear`, updates, in-place operators) are recorded in the SideEffects table and
replayed on the real set as the same operations in program order, set arguments rebuilt with
their iteration order (`_SetArg`: CPython's merge reads it); membership by identity makes the
trace identity-sensitive (the aliasing guard pins which objects are which). A new set that
escapes is rebuilt only by a recipe that provably reproduces its iteration order.
Does not own keys and rebuild recipes (set_model.py) or `a in b` dispatch (opcodes).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.side_effects import MutationType, apply_set_ops
from ferrodyn.trace_result import OutConst, OutSource, OutTuple
from ferrodyn.variables.base import (NotConstant, VariableTracker, instance_has_attr,
                                     unsupported)
from ferrodyn.variables.constant import ConstantVariable, is_constant_value
from ferrodyn.variables.set_model import (IdKey, key_of, note_identity, recipe, recipe_out,
                                          var_of)


def elements(tx, v: VariableTracker):
    """The keys of iterable `v`, in the kind CPython's set code would see: the model set of a
    set tracker (not a copy: callers do not mutate it), a frozenset constant, or a list of keys
    in iteration order for any other iterable (CPython's generic path adds one by one)."""
    v = tx.realize(v)
    if isinstance(v, SetVariable):
        return v.keys(tx)
    if isinstance(v, ConstantVariable) and isinstance(v.value, (set, frozenset)):
        return v.value
    return [key_of(tx, i) for i in v.iterator(tx).unpack(tx)]


def _is_set_kind(x) -> bool:
    return isinstance(x, (set, frozenset))


# ---- state ----------------------------------------------------------------------------------

@dataclass(eq=False)
class SetState:
    """The contents of one set object (one per object: see SideEffects' identity table).

    `real`: the model (keys), None for a set from the frame whose elements were not looked at
    yet (`lazy`: LazyVariables of its elements in the object's order, guarded on position when
    realized). `order_known`: the model replayed the object's whole history (a set from the
    frame was copied, so its model layout is not the object's). `inserted`: for a new set whose
    history is only insertions, the first-insertion order (rebuilding with it at run time repeats
    that history), else None. `ops`: (method name, argument trackers) replayed on an EXISTING set."""
    real: set | None
    mutation_type: MutationType = MutationType.NEW
    side_effects: Any = None
    source: Any = None
    obj: Any = None
    frozen: bool = False
    lazy: tuple | None = None
    positional: tuple | None = None
    order_known: bool = True
    inserted: dict | None = None
    ops: list = field(default_factory=list)

    def record(self, name: str, args: tuple) -> None:
        if self.mutation_type is MutationType.EXISTING:
            self.ops.append((name, args))
            self.side_effects.mark_mutated(self, self._replay)

    def _replay(self, tx):
        from ferrodyn.side_effects import value_out

        def arg_out(a):
            if isinstance(a, _SetArg):
                return recipe_out(tx, a.recipe)
            if isinstance(a, tuple):
                return OutTuple(tuple(arg_out(i) for i in a))
            return value_out(tx, var_of(a))
        ops = OutTuple(tuple(OutTuple((OutConst(name), OutTuple(tuple(arg_out(a) for a in args))))
                             for name, args in self.ops))
        return apply_set_ops, (OutSource(self.source), ops)


@dataclass(frozen=True, eq=False)
class SetVariable(VariableTracker):
    state: SetState = field(default_factory=lambda: SetState(set()))

    @staticmethod
    def new(keys=(), frozen: bool = False) -> "SetVariable":
        """A set made in the frame by adding `keys` one by one (BUILD_SET, `set(list)`)."""
        keys = list(keys)
        return SetVariable(state=SetState(set(keys), frozen=frozen,
                                          inserted=dict.fromkeys(keys)))

    @staticmethod
    def adopt(real: set, order_known: bool, frozen: bool = False) -> "SetVariable":
        """A set made in the frame by one C operation whose result the model computed."""
        return SetVariable(state=SetState(real, frozen=frozen, order_known=order_known,
                                          inserted=None))

    def python_type(self):
        return frozenset if self.state.frozen else set

    def identity(self):
        st = self.state
        if st.mutation_type is MutationType.EXISTING and st.obj is not None:
            return ("obj", id(st.obj))  # `is` between sets from the frame: the aliasing guard
        return st

    def describe(self):
        n = len(self.state.real) if self.state.real is not None else len(self.state.lazy)
        return f"{'frozenset' if self.state.frozen else 'set'} of {n}"

    # -- the model ---------------------------------------------------------------------------
    def keys(self, tx) -> set:
        st = self.state
        if st.real is None:
            self._realize(tx)
        return st.real

    def _realize(self, tx) -> tuple:
        st = self.state
        if st.positional is None:
            items = tuple(tx.realize(v) for v in st.lazy)
            keys = [key_of(tx, v) for v in items]
            if st.real is None:
                st.real = set(keys)
            st.positional = items
        return st.positional

    def stable_constant(self) -> bool:
        st = self.state
        return st.real is not None and not any(isinstance(k, IdKey) for k in st.real)

    def as_python_constant(self):
        """A copy, only where it iterates in the object's order (folding may iterate it)."""
        st = self.state
        if not self.stable_constant():
            raise NotConstant(self)
        copy = (frozenset if st.frozen else set)(st.real)
        if len(st.real) > 1 and (st.mutation_type is MutationType.EXISTING or
                                 not st.order_known or list(copy) != list(st.real)):
            raise NotConstant(self)
        return copy

    def unordered(self, tx) -> list | None:
        """The elements in the model's order where the caller's result does not depend on it
        (`sorted()` without a key of distinct ints or distinct strs), else None."""
        keys = self.keys(tx)
        kinds = {str if type(k) is str else int if type(k) in (int, bool) else None for k in keys}
        if len(kinds) > 1 or None in kinds:
            return None
        return [var_of(k) for k in keys]

    def order_of(self, tx, what: str) -> list:
        """The elements in iteration order, or a refusal saying why the order is unknowable."""
        st = self.state
        if st.mutation_type is MutationType.EXISTING and not st.ops and st.lazy is not None:
            return list(self._realize(tx))
        keys = self.keys(tx)
        if len(keys) > 1:
            if st.mutation_type is MutationType.EXISTING:
                unsupported(f"{what} a set from outside the frame after the frame mutated it "
                            f"(the object's order depends on its history)",
                            BreakReason.UNSUPPORTED_TYPE)
            if any(isinstance(k, IdKey) for k in keys):
                unsupported(f"{what} a set of tensors or objects (its order depends on their "
                            f"addresses at run time)", BreakReason.UNSUPPORTED_TYPE)
            if not st.order_known:
                unsupported(f"{what} a set copied from a set from outside the frame (its "
                            f"order is not known)", BreakReason.UNSUPPORTED_TYPE)
        return [var_of(k) for k in keys]

    def mutable(self, tx, op: str, args: tuple = (), insertion: bool = False) -> set:
        """The model to mutate with `op`: recorded for EXISTING sets, which refuse operations
        outside `_REPLAYABLE`; `insertion`: the op only adds elements one by one."""
        st = self.state
        if st.frozen:
            unsupported(f"frozenset.{op}", BreakReason.UNSUPPORTED_CALL)
        real = self.keys(tx)
        if st.mutation_type is MutationType.EXISTING:
            if op not in _REPLAYABLE:
                unsupported(f"set.{op} on a set from outside the frame (its effect on the "
                            f"object's layout cannot be replayed exactly)", BreakReason.SIDE_EFFECT)
            st.positional = None
            st.lazy = None
            st.record(op, args)
        elif not insertion:
            st.inserted = None
        return real

    def add_keys(self, tx, keys) -> None:
        """Insertions one by one (SET_ADD, `add`, `update(list)`)."""
        keys = list(keys)
        real = self.mutable(tx, "update" if len(keys) != 1 else "add",
                            (tuple(keys),) if len(keys) != 1 else (keys[0],), insertion=True)
        real.update(keys)
        if self.state.inserted is not None:
            for k in keys:
                self.state.inserted.setdefault(k)

    # -- protocol ----------------------------------------------------------------------------
    def unpack(self, tx):
        return self.order_of(tx, "iteration over")

    def length(self, tx):
        st = self.state
        return len(st.real) if st.real is not None else len(st.lazy)

    def truth(self, tx):
        return self.length(tx) > 0

    def contains(self, tx, item):
        key = key_of(tx, item)
        keys = self.keys(tx)
        note_identity(tx, [key, *keys])
        return key in keys

    def var_getattr(self, tx, name):
        from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
        table = _FROZEN_METHODS if self.state.frozen else _SET_METHODS
        if name in table:
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        if name == "__class__":
            from ferrodyn.variables.builder import build_unsourced
            return build_unsourced(self.python_type())
        unsupported(f"{self.python_type().__name__}.{name}", BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        return instance_has_attr(self.python_type(), name)

    def call_method(self, tx, name, args, kwargs):
        table = _FROZEN_METHODS if self.state.frozen else _SET_METHODS
        handler = table.get(name)
        if handler is None or kwargs:
            unsupported(f"{self.python_type().__name__}.{name}", BreakReason.UNSUPPORTED_CALL)
        return handler(tx, self, *args)

    def reconstruct(self, tx):
        st = self.state
        if st.mutation_type is MutationType.EXISTING:
            return OutSource(st.source)
        return tx.output.side_effects.shared(st, lambda: self._rebuild(tx))

    def _rebuild(self, tx):
        st = self.state
        rec = recipe(st.real, st.inserted, st.order_known, st.frozen)
        if rec is None:
            unsupported(f"returning a {self.describe()} made in the frame: a rebuilt set would "
                        f"not iterate in eager's order", BreakReason.UNSUPPORTED_TYPE)
        return recipe_out(tx, rec)


@dataclass(frozen=True, eq=False)
class _SetArg:
    """A set argument of an operation replayed on an EXISTING set, as it was when the operation
    ran: rebuilt by a recipe with the same iteration order and size (all that CPython's merge,
    intersection and symmetric difference read of their argument)."""
    recipe: tuple


def _set_arg(tx, v) -> _SetArg:
    """Snapshot the set operand `v` for a replayed operation, or refuse."""
    v = tx.realize(v)
    if isinstance(v, ConstantVariable):
        rec = recipe(set(v.value), None, v.source is None, False, order=list(v.value)) \
            if v.source is None else None
    else:
        st = v.state
        if st.mutation_type is MutationType.EXISTING and not st.ops and st.lazy is not None:
            items = v._realize(tx)
            rec = recipe(st.real, None, True, False, order=[key_of(tx, i) for i in items])
        else:
            inserted = dict(st.inserted) if st.inserted is not None else None
            rec = recipe(set(v.keys(tx)), inserted, _order_known(v), False,
                             order=None if inserted is not None or not _order_known(v)
                             else list(v.keys(tx)))
    if rec is None:
        unsupported("a set operation with a set argument on a set from outside the frame: "
                    "the argument's order cannot be reproduced when the operation is replayed",
                    BreakReason.SIDE_EFFECT)
    return _SetArg(rec)


# ---- methods --------------------------------------------------------------------------------

_REPLAYABLE = frozenset({"add", "discard", "remove", "clear", "pop", "update",
                         "difference_update", "intersection_update",
                         "symmetric_difference_update"})


def _none():
    return ConstantVariable(value=None)


def _add(tx, s, value):
    s.add_keys(tx, [key_of(tx, value)])
    return _none()


def _lazy_items(tx, v: VariableTracker):
    """The iterator of `v` when it is an iterator (a generator, `map`, `zip`, ...): CPython's
    generic set paths take its items one at a time, so the producer may see the set change
    between items; None for sets, constants and containers (taken whole, as before)."""
    from ferrodyn.variables.lists import IteratorVariable
    v = tx.realize(v)
    return v if isinstance(v, IteratorVariable) else None


def _each_key(tx, it):
    while (item := it.next(tx)) is not None:
        yield key_of(tx, item)


def _update(tx, s, *others):
    for o in others:
        it = _lazy_items(tx, o)
        if it is not None:  # set_update_internal: one insertion per item taken
            for k in _each_key(tx, it):
                s.add_keys(tx, [k])
            continue
        ks = elements(tx, o)
        if _is_set_kind(ks):
            args = (_set_arg(tx, o),) if s.state.mutation_type is MutationType.EXISTING else ()
            s.mutable(tx, "update", args).update(ks)
            s.state.order_known = s.state.order_known and _order_known(o)
        else:
            s.add_keys(tx, ks)
    return _none()


def _discard(tx, s, value):
    key = key_of(tx, value)
    note_identity(tx, [key, *s.keys(tx)])
    s.mutable(tx, "discard", (key,)).discard(key)
    return _none()


def raise_key_error(tx, value: VariableTracker):
    from ferrodyn.variables.exceptions import ExceptionVariable, TracedException
    raise TracedException(ExceptionVariable(cls=KeyError, args=(tx.realize(value),)))


def _remove(tx, s, value):
    key = key_of(tx, value)
    note_identity(tx, [key, *s.keys(tx)])
    if key not in s.keys(tx):
        raise_key_error(tx, value)
    s.mutable(tx, "remove", (key,)).remove(key)
    return _none()


def _pop(tx, s):
    keys = s.keys(tx)
    if not keys:
        raise_key_error(tx, ConstantVariable(value="pop from an empty set"))
    if len(keys) > 1:
        if s.state.mutation_type is MutationType.EXISTING:
            unsupported("set.pop on a set from outside the frame with more than one element "
                        "(which one depends on the object's history)", BreakReason.UNSUPPORTED_CALL)
        s.order_of(tx, "set.pop on")  # refuses where the model's order is not eager's
    return var_of(s.mutable(tx, "pop").pop())


def _clear(tx, s):
    s.mutable(tx, "clear").clear()
    return _none()


def _bulk_update(op: Callable):
    """`difference_update`/`intersection_update`: with non-set arguments CPython takes the
    generic path, which a tuple argument reproduces when replayed."""
    name = op.__name__

    def handler(tx, s, *others):
        if name == "difference_update" and any(_lazy_items(tx, o) is not None for o in others):
            # set_difference_update_internal: one discard per item taken from an iterator
            for o in others:
                it = _lazy_items(tx, o)
                if it is None:
                    handler(tx, s, o)
                    continue
                for k in _each_key(tx, it):
                    note_identity(tx, [k, *s.keys(tx)])
                    s.mutable(tx, "discard", (k,)).discard(k)
            return _none()
        args = [elements(tx, o) for o in others]
        note_identity(tx, [k for a in args for k in a] + list(s.keys(tx)))
        existing = s.state.mutation_type is MutationType.EXISTING
        replayed = tuple(_set_arg(tx, o) if existing and _is_set_kind(a) else tuple(a)
                         for o, a in zip(others, args)) if existing else ()
        real = s.mutable(tx, name, replayed)
        op(real, *args)
        if name == "intersection_update" and any(_is_set_kind(a) for a in args):
            s.state.order_known = s.state.order_known and all(_order_known(o) for o in others)
        return _none()
    return handler


def _order_known(v) -> bool:
    """Whether the model of `v` (a set, or a frozenset constant) has the object's layout: a set
    made in the frame with a replayed history, or a constant made in the code (an equal
    frozenset read from the frame may have been built differently)."""
    if isinstance(v, ConstantVariable):
        return v.source is None
    return not isinstance(v, SetVariable) or v.state.order_known and \
        v.state.mutation_type is MutationType.NEW


def _pure(op: Callable, returns_set: bool = True):
    def handler(tx, s, *others):
        if s.state.frozen and op is set.copy:
            return s  # frozenset.copy() is the object itself
        args = [elements(tx, o) for o in others]
        keys = s.keys(tx)
        note_identity(tx, [k for a in args for k in a] + list(keys))
        result = op(keys, *args)
        if not returns_set:
            return ConstantVariable(value=result)
        known = _order_known(s) and all(_order_known(o) for o in others)
        return SetVariable.adopt(result, known, frozen=s.state.frozen)
    return handler


def _stops_early(op: Callable, stop_when: bool):
    """`isdisjoint` / `issuperset`: over an iterator CPython takes items one at a time and stops
    at the first that decides (one in the set / one not in it), leaving the rest untaken."""
    pure = _pure(op, False)

    def handler(tx, s, *others):
        it = _lazy_items(tx, others[0]) if len(others) == 1 else None
        if it is None:
            return pure(tx, s, *others)
        for k in _each_key(tx, it):
            note_identity(tx, [k, *s.keys(tx)])
            if (k in s.keys(tx)) == stop_when:
                return ConstantVariable(value=False)
        return ConstantVariable(value=True)
    return handler


def _contains_method(tx, s, v):
    return ConstantVariable(value=s.contains(tx, v))


_PURE = {
    "union": _pure(set.union), "intersection": _pure(set.intersection),
    "difference": _pure(set.difference),
    "symmetric_difference": _pure(set.symmetric_difference),
    "copy": _pure(set.copy), "issubset": _pure(set.issubset, False),
    "issuperset": _stops_early(set.issuperset, False),
    "isdisjoint": _stops_early(set.isdisjoint, True),
    "__contains__": _contains_method,
}

_SET_METHODS: dict[str, Callable] = {
    **_PURE,
    "add": _add, "discard": _discard, "remove": _remove, "pop": _pop,
    "update": _update, "clear": _clear,
    "difference_update": _bulk_update(set.difference_update),
    "intersection_update": _bulk_update(set.intersection_update),
}

_FROZEN_METHODS: dict[str, Callable] = dict(_PURE)


# ---- constructors, operators ---------------------------------------------------------------

def make_set(tx, iterable=None, frozen: bool = False) -> VariableTracker:
    """`set(iterable)` / `frozenset(iterable)`; a frozenset of constants in a known order is a
    constant."""
    if iterable is None:
        return ConstantVariable(value=frozenset()) if frozen else SetVariable.new()
    iterable = tx.realize(iterable)
    keys = elements(tx, iterable)
    known = not _is_set_kind(keys) or _order_known(iterable)
    if frozen and known and all(is_constant_value(k) for k in keys):
        return ConstantVariable(value=frozenset(keys))
    if _is_set_kind(keys):  # CPython merges a set argument (a copy of its layout)
        return SetVariable.adopt(set(keys), known, frozen=frozen)
    return SetVariable.new(keys, frozen=frozen)


def set_update(tx, s: SetVariable, iterable) -> None:
    """SET_UPDATE (`{*a, *b}`) and `s.update(iterable)`."""
    _update(tx, s, iterable)


_BINARY = {operator.or_: set.union, operator.and_: set.intersection,
           operator.sub: set.difference, operator.xor: set.symmetric_difference}
_INPLACE = {operator.ior: (operator.or_, "update"), operator.iand: (operator.and_, "intersection_update"),
            operator.isub: (operator.sub, "difference_update"),
            operator.ixor: (operator.xor, "symmetric_difference_update")}


def _set_operand(tx, v):
    v = tx.realize(v)
    if isinstance(v, SetVariable):
        return v.keys(tx)
    if isinstance(v, ConstantVariable) and isinstance(v.value, (set, frozenset)):
        return v.value
    return None


def set_binary(tx, fn, a, b) -> VariableTracker | None:
    """`a | b`, `a & b`, `a - b`, `a ^ b` and their in-place forms when a set is involved."""
    base, method = _INPLACE.get(fn, (fn, None))
    if base not in _BINARY:
        return None
    ka, kb = _set_operand(tx, a), _set_operand(tx, b)
    if ka is None or kb is None:
        unsupported(f"set operator {base.__name__} with a non-set operand", BreakReason.EXCEPTION)
    note_identity(tx, [*ka, *kb])
    a_frozen = not isinstance(a, SetVariable) or a.state.frozen
    if method is not None and isinstance(a, SetVariable) and not a.state.frozen:
        st = a.state
        args = (_set_arg(tx, b),) if st.mutation_type is MutationType.EXISTING else ()
        real = a.mutable(tx, method, args)
        getattr(set, method)(real, kb)
        if method != "difference_update":
            st.order_known = st.order_known and _order_known(b)
        return a
    result = _BINARY[base](set(ka) if isinstance(ka, frozenset) else ka, kb)
    known = _order_known(a) and _order_known(b) and not isinstance(ka, frozenset)
    return SetVariable.adopt(result, known, frozen=a_frozen)


_COMPARE = {operator.le: operator.le, operator.lt: operator.lt, operator.ge: operator.ge,
            operator.gt: operator.gt, operator.eq: operator.eq, operator.ne: operator.ne}


_NEVER_EQUAL_TO_A_SET = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict)


def set_compare(tx, fn, a, b) -> VariableTracker | None:
    """`a <= b` (subset) and friends, `==`/`!=`, when a set tracker is involved."""
    if fn not in _COMPARE:
        return None
    ka, kb = _set_operand(tx, a), _set_operand(tx, b)
    if ka is None or kb is None:
        other = tx.realize(b if ka is not None else a)
        if fn in (operator.eq, operator.ne) and other.python_type() in _NEVER_EQUAL_TO_A_SET:
            return ConstantVariable(value=fn is operator.ne)
        # dict views, user Set classes, ...: their comparisons are not modelled here
        unsupported(f"set comparison {fn.__name__} with a {other.describe()}",
                    BreakReason.UNSUPPORTED_TYPE)
    note_identity(tx, [*ka, *kb])
    return ConstantVariable(value=_COMPARE[fn](set(ka), set(kb)))


# ---- sets from the frame ----------------------------------------------------------------------

MAX_GUARDED_ELEMENTS = 64  # a SetItemSource read walks the set: guards cost O(n^2)


def build_set(tx, value, source, existing: dict) -> VariableTracker:
    """A set or frozenset read from `source` (builder.py): TYPE_MATCH + LENGTH, and each element
    reached through `SetItemSource` (its position in the object's order). Constant elements
    are guarded at once (type and value, or identity for enum members and other constants), so
    membership, order and contents are all pinned; a frozenset of constants stays a constant.
    Other elements (tensors, objects) stay lazy until the trace needs them, then are guarded as
    the builder guards their type."""
    from ferrodyn.guard_spec import GuardKind
    from ferrodyn.source import SetItemSource
    from ferrodyn.variables.base import LazyVariable
    t = type(value)
    if len(value) > MAX_GUARDED_ELEMENTS:
        unsupported(f"a {t.__name__} of {len(value)} elements at {source.name()} (more than "
                    f"{MAX_GUARDED_ELEMENTS}: each element's guard reads it by position)",
                    BreakReason.UNSUPPORTED_TYPE)
    guard = tx.output.install_guard
    guard(source, GuardKind.TYPE_MATCH, t)
    guard(source, GuardKind.LENGTH, len(value))
    constant = all(is_constant_value(v) for v in value)
    items = []
    for i, v in enumerate(value):
        src = SetItemSource(source, i)
        if constant:
            _guard_constant(tx, src, v)
            items.append(ConstantVariable(source=src, value=v))
        else:
            items.append(LazyVariable(source=src, value=v))
    if t is frozenset and constant:
        return ConstantVariable(source=source, value=value)
    if t is frozenset:
        existing = dict(existing, mutation_type=MutationType.EXISTING)
    state = SetState(set(value) if constant else None, frozen=t is frozenset, lazy=tuple(items),
                     positional=tuple(items) if constant else None, order_known=False,
                     inserted=None, **existing)
    return SetVariable(source=source, state=state)


_EQUALS_TYPES = (bool, int, float, str, bytes)


def _guard_constant(tx, source, v) -> None:
    from ferrodyn.guard_spec import GuardKind
    guard = tx.output.install_guard
    if v is None:
        guard(source, GuardKind.NONE)
    elif type(v) in _EQUALS_TYPES or type(v) is tuple and \
            all(type(i) in _EQUALS_TYPES or i is None for i in v):
        guard(source, GuardKind.TYPE_MATCH, type(v))
        guard(source, GuardKind.EQUALS, v)
    else:  # enum members, dtypes, nested frozensets: the same object (equal ones recompile)
        guard(source, GuardKind.ID_MATCH, v)

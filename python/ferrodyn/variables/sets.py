"""Set trackers for sets of constants (`{"a", "b"}`, `set(xs)`, set comprehensions).

Owns `SetVariable`: the elements are Python constants kept in a real `set` (in the shared
`SetState`) that replays the same operations, so membership, size and iteration order are
those of eager. Sets from the frame are EXISTING: single-element mutations (add, discard,
remove, clear) are recorded in the SideEffects table and replayed as the same operations in
program order (a set's iteration order depends on its history); iterating such a set (more than
one element: the tracker's copy may order them differently) and bulk updates are refused.
Does not own frozensets of constants (plain constants, constant.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.side_effects import MutationType, apply_set_ops
from ferrodyn.trace_result import OutCall, OutConst
from ferrodyn.variables.base import instance_has_attr, VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable, fold


def element(tx, v: VariableTracker):
    v = tx.realize(v)
    if not v.is_python_constant():
        unsupported(f"set element {v.describe()}", BreakReason.UNSUPPORTED_TYPE)
    value = v.as_python_constant()
    fold(hash, value)
    return value


def elements(tx, v: VariableTracker) -> set:
    v = tx.realize(v)
    if isinstance(v, SetVariable):
        return set(v.state.real)
    if isinstance(v, ConstantVariable) and isinstance(v.value, (set, frozenset)):
        return set(v.value)
    return {element(tx, i) for i in v.iterator(tx).unpack(tx)}


@dataclass(eq=False)
class SetState:
    """The contents of one set object (one per object: see SideEffects' identity table)."""
    real: set
    mutation_type: MutationType = MutationType.NEW
    side_effects: Any = None
    source: Any = None
    ops: list = field(default_factory=list)  # (set method name, args) of an EXISTING set

    def record(self, name: str, args: tuple) -> None:
        if self.mutation_type is MutationType.EXISTING:
            self.ops.append((name, args))
            self.side_effects.mark_mutated(self, self._replay)

    def _replay(self, tx):
        from ferrodyn.trace_result import OutSource
        return apply_set_ops, (OutSource(self.source), OutConst(tuple(self.ops)))


@dataclass(frozen=True, eq=False)
class SetVariable(VariableTracker):
    state: SetState = field(default_factory=lambda: SetState(set()))

    @staticmethod
    def new(values) -> "SetVariable":
        return SetVariable(state=SetState(set(values)))

    def python_type(self):
        return set

    def identity(self):
        return self.state

    def describe(self):
        return f"set of {len(self.state.real)}"

    def as_python_constant(self):
        return set(self.state.real)

    def mutable(self, op: str = "", args: tuple = ()) -> set:
        """The real set to mutate; `op`/`args`: the operation, recorded for EXISTING sets
        (operations without a name are refused on them)."""
        if self.state.mutation_type is MutationType.EXISTING:
            if op not in _REPLAYABLE:
                unsupported(f"set.{op or 'update'} on a set from outside the frame",
                            BreakReason.SIDE_EFFECT)
            self.state.record(op, args)
        return self.state.real

    def unpack(self, tx):
        if self.state.mutation_type is MutationType.EXISTING and len(self.state.real) > 1:
            unsupported("iteration over a set from outside the frame (its order is not "
                        "guarded)", BreakReason.UNSUPPORTED_TYPE)
        return [ConstantVariable(value=v) for v in self.state.real]

    def length(self, tx):
        return len(self.state.real)

    def truth(self, tx):
        return bool(self.state.real)

    def contains(self, tx, item):
        return element(tx, item) in self.state.real

    def var_getattr(self, tx, name):
        from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
        if name in _SET_METHODS:
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        unsupported(f"set.{name}", BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        return instance_has_attr(self.python_type(), name)

    def call_method(self, tx, name, args, kwargs):
        handler = _SET_METHODS.get(name)
        if handler is None or kwargs:
            unsupported(f"set.{name}", BreakReason.UNSUPPORTED_CALL)
        return handler(tx, self, *args)

    def reconstruct(self, tx):
        st = self.state
        if st.mutation_type is MutationType.EXISTING:
            from ferrodyn.trace_result import OutSource
            return OutSource(st.source)
        return tx.output.side_effects.shared(
            st, lambda: OutCall(set, (OutConst(tuple(st.real)),)))


_REPLAYABLE = frozenset({"add", "discard", "remove", "clear"})
_SINGLE = (set.add, set.discard, set.remove)


def _mutating(op: Callable):
    def handler(tx, s, *others):
        args = tuple(element(tx, o) if op in _SINGLE else elements(tx, o) for o in others)
        op(s.mutable(op.__name__, args), *args)
        return ConstantVariable(value=None)
    return handler


def _remove(tx, s, value):
    v = element(tx, value)
    if v not in s.state.real:
        unsupported(f"KeyError: {v!r}", BreakReason.EXCEPTION)
    s.mutable("remove", (v,)).remove(v)
    return ConstantVariable(value=None)


def _pure(op: Callable, wrap_set: bool = True):
    def handler(tx, s, *others):
        result = op(set(s.state.real), *[elements(tx, o) for o in others])
        return SetVariable.new(result) if wrap_set else ConstantVariable(value=result)
    return handler


_SET_METHODS: dict[str, Callable] = {
    "add": _mutating(set.add), "discard": _mutating(set.discard), "remove": _remove,
    "update": _mutating(set.update), "clear": _mutating(set.clear),
    "difference_update": _mutating(set.difference_update),
    "intersection_update": _mutating(set.intersection_update),
    "union": _pure(set.union), "intersection": _pure(set.intersection),
    "difference": _pure(set.difference),
    "symmetric_difference": _pure(set.symmetric_difference),
    "copy": _pure(set.copy), "issubset": _pure(set.issubset, False),
    "issuperset": _pure(set.issuperset, False), "isdisjoint": _pure(set.isdisjoint, False),
    "__contains__": lambda tx, s, v: ConstantVariable(value=s.contains(tx, v)),
}


def set_binary(tx, fn, a, b) -> VariableTracker | None:
    """`a | b`, `a & b`, `a - b`, `a ^ b` and comparisons when a set is involved."""
    import operator
    ops = {operator.or_: set.union, operator.and_: set.intersection,
           operator.sub: set.difference, operator.xor: set.symmetric_difference}
    inplace = {operator.ior: operator.or_, operator.iand: operator.and_,
               operator.isub: operator.sub, operator.ixor: operator.xor}
    base = inplace.get(fn, fn)
    if base not in ops:
        return None
    result = ops[base](elements(tx, a), elements(tx, b))
    if fn in inplace and isinstance(a, SetVariable):
        real = a.mutable()
        real.clear()
        real.update(result)
        return a
    return SetVariable.new(result)

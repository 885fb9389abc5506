"""Subscripts of `typing` aliases: `List[torch.Tensor]`, `Dict[str, Optional[Tensor]]`,
`Tuple[int, ...]` (as in `torch.jit.annotate(List[Tensor], [])`).

Owns `TypingVariable` (an alias made by such a subscript while tracing, or a `types.UnionType`
such as `int | None` read from the frame: `build_union_type`, whose `__args__` and
`__parameters__` are constants) and `subscript`, which folds one. CPython's subscript runs typing's `__getitem__`, which only reads the alias and its
arguments and returns an alias object (cached by typing's own lru_cache: equal arguments give
the same object again). The fold makes that call at trace time on the real objects (the
subscripted alias and every argument pinned by identity or value through their sources) and
keeps its result as a constant: compiled re-runs hand back the object the trace got, which is
the object eager code gets while typing's cache holds it, and an equal alias otherwise.
Arguments must be classes, typing aliases, None, Ellipsis or immutable constants (tuples of
them included); anything else (a tensor, a list, an object) is refused, and so is a subscript
that raises (eager raises it). Does not own typing objects read from the frame (builder.py:
plain objects, ID_MATCH-guarded where the trace depends on which one) nor isinstance with a
typing alias (builtins.py).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import is_constant_value


def is_typing_object(value: Any) -> bool:
    """An object of one of typing's own types (`typing.List`, `Optional`, `List[int]`) or a
    builtin generic alias (`list[int]`)."""
    return type(value).__module__ == "typing" or type(value) is types.GenericAlias


@dataclass(frozen=True, eq=False)
class TypingVariable(VariableTracker):
    """A typing alias made by a subscript in the trace: a constant object."""

    value: Any = None

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value

    def identity(self):
        return ("obj", id(self.value))

    def describe(self):
        return f"typing alias {self.value!r}"

    def getitem(self, tx, index):
        return subscript(tx, self, index)

    def var_getattr(self, tx, name):
        """The parts a union type fixes at creation (`(int | None).__args__`, what
        `typing.get_args` reads): constants of the constant alias."""
        if type(self.value) is types.UnionType and name in _UNION_PARTS:
            from ferrodyn.variables.builder import build_unsourced
            return build_unsourced(getattr(self.value, name))
        return super().var_getattr(tx, name)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        return OutConst(self.value)


_UNION_PARTS = frozenset({"__args__", "__parameters__"})


def build_union_type(tx, value, source) -> TypingVariable:
    """A `types.UnionType` (`int | None`) read from the frame: immutable (its arguments are
    fixed when `|` makes it), guarded by identity."""
    from ferrodyn.guard_spec import GuardKind
    tx.output.install_guard(source, GuardKind.ID_MATCH, value)
    return TypingVariable(source=source, value=value)


def _argument(tx, v: VariableTracker) -> Any:
    from ferrodyn.guard_spec import GuardKind
    from ferrodyn.variables.lists import TupleVariable
    v = tx.realize(v)
    if isinstance(v, TupleVariable):
        return tuple(_argument(tx, item) for item in v.unpack(tx))
    if isinstance(v, TypingVariable):
        return v.value
    value = getattr(v, "value", None)
    if is_typing_object(value) and not v.is_python_constant():  # a typing object of the frame
        if v.source is None:
            unsupported(f"a typing alias of unknown origin ({value!r})", BreakReason.UNSUPPORTED_TYPE)
        tx.output.install_guard(v.source, GuardKind.ID_MATCH, value)
        return value
    if v.is_python_constant():
        value = v.as_python_constant()
        if isinstance(value, type) or value is None or value is Ellipsis or \
                is_typing_object(value) or is_constant_value(value):
            return value
    unsupported(f"subscript of a typing alias with {v.describe()}", BreakReason.UNSUPPORTED_TYPE)


def subscript(tx, alias: VariableTracker, index: VariableTracker) -> TypingVariable:
    """`alias[index]` for a typing alias (module docstring)."""
    target = _argument(tx, alias)
    key = _argument(tx, index)
    try:
        return TypingVariable(value=target[key])
    except Exception as e:  # eager raises it: the frame runs eagerly and does
        unsupported(f"{target!r}[...] raised {type(e).__name__}: {e}", BreakReason.EXCEPTION)

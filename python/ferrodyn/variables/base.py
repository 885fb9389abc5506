"""The VariableTracker base class: a symbolic stand-in for one Python value during tracing.

Owns the tracker protocol (attribute access, calls, iteration, truth, conversion to fx
arguments, reconstruction of outputs), `LazyVariable` (an input not yet looked at), the
`NullVariable` stack marker, and `unsupported()`, the one way a tracker gives up. Does not own
building trackers from values (builder.py) or guards (output_graph.py installs them when the
translator uses a value).

Trackers are immutable (frozen dataclasses, compared by identity). State that Python code can
mutate (a list created in the frame, a cell, an iterator, an object's attributes) lives in a
separate mutable *state* object that the tracker points to, so aliases see the same contents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.source import Source

if TYPE_CHECKING:  # pragma: no cover
    from ferrodyn.symbolic.translator import InstructionTranslator as Tx
    from ferrodyn.trace_result import Out


class NotConstant(Exception):
    """Control-flow signal: the tracker has no Python-constant value."""


def instance_has_attr(cls: type, name: str) -> bool:
    """`hasattr(instance, name)` for an instance of a builtin type without `__getattr__` and
    with no instance dict: the name is on the type's MRO (`hasattr(cls, name)` would also find
    the metaclass's attributes: `hasattr(tuple, "__call__")` is True)."""
    return any(name in vars(klass) for klass in cls.__mro__)


def unsupported(msg: str, reason: BreakReason = BreakReason.OTHER) -> NoReturn:
    """Give up on the frame. The translator adds the user's file and line."""
    raise Unsupported(msg, reason)


def raised_while_tracing(msg: str) -> NoReturn:
    """Give up on an instruction whose real operation raised at trace time (exc.py
    `RaisedWhileTracing`: uncaught, the frame runs eagerly instead of breaking there)."""
    from ferrodyn.exc import RaisedWhileTracing
    raise RaisedWhileTracing(msg)


@dataclass(frozen=True, eq=False)
class VariableTracker:
    """Base of all trackers. `source` says where the value came from (None: made in the frame)."""

    source: Source | None = None

    # -- identity / type -------------------------------------------------------------------
    def python_type(self) -> type:
        unsupported(f"type of {self}", BreakReason.UNSUPPORTED_TYPE)

    def as_python_constant(self) -> Any:
        raise NotConstant(self)

    def is_python_constant(self) -> bool:
        try:
            self.as_python_constant()
        except NotConstant:
            return False
        return True

    def identity(self) -> Any:
        """A key equal for trackers standing for the same object (for `is`)."""
        return self

    def describe(self) -> str:
        return type(self).__name__

    # -- protocol (defaults give up) ---------------------------------------------------------
    def var_getattr(self, tx: "Tx", name: str) -> "VariableTracker":
        unsupported(f"attribute {name!r} of {self.describe()}", BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx: "Tx", name: str) -> bool:
        unsupported(f"hasattr({self.describe()}, {name!r})", BreakReason.UNSUPPORTED_TYPE)

    def call_function(self, tx: "Tx", args: list["VariableTracker"],
                      kwargs: dict[str, "VariableTracker"]) -> "VariableTracker":
        unsupported(f"call of {self.describe()}", BreakReason.UNSUPPORTED_CALL)

    def call_method(self, tx: "Tx", name: str, args: list["VariableTracker"],
                    kwargs: dict[str, "VariableTracker"]) -> "VariableTracker":
        return tx.realize(self.var_getattr(tx, name)).call_function(tx, args, kwargs)

    def unpack(self, tx: "Tx") -> list["VariableTracker"]:
        """The items iteration would produce, in order (for loops, unpacking, builtins)."""
        unsupported(f"iteration over {self.describe()}", BreakReason.UNSUPPORTED_TYPE)

    def iterator(self, tx: "Tx") -> "VariableTracker":
        from ferrodyn.variables.lists import IteratorVariable
        return IteratorVariable.over(self.unpack(tx))

    def truth(self, tx: "Tx") -> bool:
        return True

    def length(self, tx: "Tx") -> int:
        return len(self.unpack(tx))

    def getitem(self, tx: "Tx", index: "VariableTracker") -> "VariableTracker":
        unsupported(f"indexing {self.describe()}", BreakReason.UNSUPPORTED_TYPE)

    def setitem(self, tx: "Tx", index: "VariableTracker", value: "VariableTracker") -> None:
        unsupported(f"item assignment on {self.describe()}", BreakReason.SIDE_EFFECT)

    def delitem(self, tx: "Tx", index: "VariableTracker") -> None:
        unsupported(f"item deletion on {self.describe()}", BreakReason.SIDE_EFFECT)

    def setattr(self, tx: "Tx", name: str, value: "VariableTracker") -> None:
        unsupported(f"setattr {name!r} on {self.describe()}", BreakReason.SIDE_EFFECT)

    def contains(self, tx: "Tx", item: "VariableTracker") -> bool:
        from ferrodyn.variables.operators import values_equal
        return any(values_equal(tx, tx.realize(x), item) for x in self.unpack(tx))

    # -- graph / output ---------------------------------------------------------------------
    def fx_arg(self, tx: "Tx") -> tuple[Any, Any]:
        """(argument for an fx node, example value for fake execution)."""
        unsupported(f"{self.describe()} as an argument of a graph op", BreakReason.UNSUPPORTED_TYPE)

    def reconstruct(self, tx: "Tx") -> "Out":
        from ferrodyn.trace_result import OutSource
        if self.source is not None:
            return OutSource(self.source)
        unsupported(f"returning {self.describe()}", BreakReason.UNSUPPORTED_TYPE)


@dataclass(frozen=True, eq=False)
class LazyVariable(VariableTracker):
    """A value reachable from the frame that the trace has not used yet. Realized (built, with its
    guards installed) when it reaches the stack; returned unrealized it is `OutSource`."""

    value: Any = None

    def describe(self) -> str:
        return f"lazy {type(self.value).__name__}"


@dataclass(frozen=True, eq=False)
class NullVariable(VariableTracker):
    """The NULL that CPython pushes below a callable (and LOAD_FAST_AND_CLEAR's empty slot)."""

    def describe(self) -> str:
        return "NULL"


NULL = NullVariable()

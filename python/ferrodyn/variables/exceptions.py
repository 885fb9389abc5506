"""Exceptions raised and handled inside the traced code, decided at trace time: the exception
object (`ExceptionVariable`) and the signal that carries it up the translator stack
(`TracedException`) until a frame's exception table has a handler for the raising instruction
(symbolic/exceptions.py unwinds).

An exception no traced frame handles gives up on the frame (it is an `Unsupported`): eager
raises it for real. Does not own the opcodes (symbolic/exceptions.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.variables.base import VariableTracker, unsupported


@dataclass(frozen=True, eq=False)
class ExceptionVariable(VariableTracker):
    """An instance of an exception class made in the traced code: `cls(*args)`."""

    cls: type = Exception
    args: tuple = ()
    raised_at: list = field(default_factory=list)  # (file, line) where first raised

    def python_type(self):
        return self.cls

    def describe(self):
        return f"{self.cls.__name__} exception"

    def var_getattr(self, tx, name):
        from ferrodyn.variables.lists import TupleVariable
        if name == "args":
            return TupleVariable(items=tuple(self.args))
        if name == "__class__":
            from ferrodyn.variables.builder import build_unsourced
            return build_unsourced(self.cls)
        unsupported(f"attribute {name!r} of {self.describe()}", BreakReason.EXCEPTION)


def can_make(cls: type) -> bool:
    """Exception classes whose instances are modelled: builtin ones, and user subclasses that
    keep BaseException's construction."""
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return False
    if cls.__module__ == "builtins":
        return True
    return all(k.__module__ == "builtins" or ("__init__" not in vars(k) and
                                              "__new__" not in vars(k)) for k in cls.__mro__)


def make(tx, cls: type, args, kwargs) -> ExceptionVariable:
    if kwargs:
        unsupported(f"{cls.__name__}() with keyword arguments", BreakReason.EXCEPTION)
    return ExceptionVariable(cls=cls, args=tuple(tx.realize(a) for a in args))


class TracedException(Unsupported):
    """Control-flow signal: `exc` was raised at the current instruction of the innermost
    translator. A translator with a handler catches it; past the root frame it is a refusal
    that names where the exception was first raised."""

    def __init__(self, exc: ExceptionVariable):
        where = exc.raised_at[0] if exc.raised_at else (None, None)
        super().__init__(f"uncaught {exc.cls.__name__} raised in the traced code",
                         BreakReason.EXCEPTION, filename=where[0], lineno=where[1])
        self.exc = exc

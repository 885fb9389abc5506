"""Opcode handlers and unwinding for exceptions raised and handled at trace time (RAISE_VARARGS,
PUSH_EXC_INFO, CHECK_EXC_MATCH, POP_EXCEPT, RERAISE, CLEANUP_THROW) — `try`/`except`/`finally` where the raise
is decided while tracing.

`unwind(tx, exc)` does what CPython's exception unwinding does for one frame: find the entry of
the code's exception table that covers the raising instruction, cut the value stack to the
entry's depth (pushing the offset when `lasti` is set), push the exception and jump to the
handler; without an entry the signal goes on to the calling translator. A new raise (not a
re-raise) first chains the exception to the one being handled (`__context__`, variables/
exceptions.py `set_context`). The exceptional path of `with` blocks (WITH_EXCEPT_START) is
opcodes_with.py's.
"""

from __future__ import annotations

import dis
import types

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.instructions import decode
from ferrodyn.symbolic.registry import opcode
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.exceptions import (
    ExceptionVariable, TracedException, can_make, handled, make, set_context)

_TABLES: dict[int, tuple[types.CodeType, list, dict]] = {}


def _table(code: types.CodeType):
    hit = _TABLES.get(id(code))
    if hit is None or hit[0] is not code:
        entries = dis._parse_exception_table(code)  # (start, end, target, depth, lasti)
        index_of = {inst.offset: n for n, inst in enumerate(decode(code))}
        hit = _TABLES[id(code)] = (code, entries, index_of)
    return hit[1], hit[2]


def unwind(tx, signal: TracedException) -> None:
    """Jump to the handler of the current instruction for `signal.exc`, or re-raise."""
    if signal.chain:  # a new raise: chained to the exception being handled, once
        signal.chain = False
        set_context(tx, signal.exc)
    if not signal.exc.raised_at:
        signal.exc.raised_at.append((tx.code.co_filename, tx.current.lineno))
        signal = TracedException(signal.exc, chain=False)
    entries, index_of = _table(tx.code)
    offset = tx.current.offset
    for entry in entries:
        if entry.start <= offset < entry.end:
            del tx.stack[entry.depth:]
            if entry.lasti:
                tx.stack.append(ConstantVariable(value=offset))
            tx.stack.append(signal.exc)
            tx.ip = index_of[entry.target]
            return
    raise signal


def exception_of(tx, v) -> ExceptionVariable:
    v = tx.realize(v)
    if isinstance(v, ExceptionVariable):
        return v
    if v.is_python_constant() and can_make(v.as_python_constant()):
        return make(tx, v.as_python_constant(), (), {})  # `raise ValueError`
    unsupported(f"raise {v.describe()}", BreakReason.EXCEPTION)


@opcode()
def RAISE_VARARGS(tx, inst):
    if inst.arg == 0:  # bare `raise`: the exception being handled, here or by a caller
        current = handled(tx)
        if current is None or (current.is_python_constant() and
                                current.as_python_constant() is None):
            raise TracedException(make(tx, RuntimeError, (
                ConstantVariable(value="No active exception to reraise"),), {}))
        if not isinstance(current, ExceptionVariable):
            unsupported(f"re-raise of {current.describe()}", BreakReason.EXCEPTION)
        raise TracedException(current, chain=False)
    cause = tx.realize(tx.pop()) if inst.arg == 2 else None
    exc = exception_of(tx, tx.pop())
    if cause is not None:  # `raise X from Y`: __cause__ = Y (made if a class), context hidden
        if cause.is_python_constant() and cause.as_python_constant() is None:
            exc.set_chain("__cause__", None)
        else:
            exc.set_chain("__cause__", exception_of(tx, cause))
        exc.set_chain("__suppress_context__", True)
    raise TracedException(exc)


@opcode()
def PUSH_EXC_INFO(tx, inst):
    exc = tx.pop()
    tx.push(tx.exc_stack[-1] if tx.exc_stack else ConstantVariable(value=None))
    tx.exc_stack.append(exc)
    tx.push(exc)


@opcode()
def POP_EXCEPT(tx, inst):
    tx.pop()
    if tx.exc_stack:
        tx.exc_stack.pop()


@opcode()
def CHECK_EXC_MATCH(tx, inst):
    match = tx.realize(tx.pop())
    exc = tx.realize(tx.peek())
    if not match.is_python_constant():
        unsupported(f"except {match.describe()}", BreakReason.EXCEPTION)
    classes = match.as_python_constant()
    if not isinstance(exc, ExceptionVariable):
        unsupported(f"except clause on {exc.describe()}", BreakReason.EXCEPTION)
    tx.push(ConstantVariable(value=issubclass(exc.cls, classes)))


@opcode()
def RERAISE(tx, inst):
    exc = tx.pop()
    if not isinstance(exc, ExceptionVariable):
        unsupported(f"re-raise of {exc.describe()}", BreakReason.EXCEPTION)
    raise TracedException(exc, chain=False)


@opcode(since=(3, 12))
def CLEANUP_THROW(tx, inst):
    """The handler around `yield from`'s SEND/YIELD_VALUE (an exception thrown into the
    delegating generator: close()): stack sub-iterator, last sent value, exception. A
    StopIteration ends the delegation with its value; anything else goes on unwinding."""
    exc = tx.realize(tx.pop())
    if not isinstance(exc, ExceptionVariable):
        unsupported(f"CLEANUP_THROW of {exc.describe()}", BreakReason.EXCEPTION)
    if not issubclass(exc.cls, StopIteration):
        raise TracedException(exc, chain=False)
    del tx.stack[-2:]
    tx.push(ConstantVariable(value=None))
    tx.push(exc.var_getattr(tx, "value"))

"""The exceptional exit of a `with` block (WITH_EXCEPT_START): an exception raised at trace
time inside the block (symbolic/exceptions.py unwinds to the block's cleanup) is passed to the
context manager's `__exit__(type, value, traceback)`, whose result decides, as in CPython,
whether the cleanup code swallows it or re-raises it.

Owns that opcode handler; the traceback argument is exceptions.py's `TracebackVariable`
(only its identity is modelled: `tb is None` is False; any other use is refused). Every
tracker's `__exit__` decides itself whether it accepts an exception: grad mode, autocast and
state contexts restore their state as on a normal exit; `contextmanager` generators have it
thrown in at their `yield` and ExitStack passes it down its exits (contextlib_vars.py); user
classes run their inlined `__exit__`. Does not
own raising and unwinding (exceptions.py) or entering (opcodes_control.py BEFORE_WITH).
"""

from __future__ import annotations

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.registry import opcode
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.exceptions import ExceptionVariable, TracebackVariable


@opcode()
def WITH_EXCEPT_START(tx, inst):
    """Stack: ..., exit_func, lasti, previous exception, exception (3.11-3.13): push
    `exit_func(type(exc), exc, traceback)`."""
    from ferrodyn.variables.builder import build_unsourced
    if len(tx.stack) < 4:
        unsupported("WITH_EXCEPT_START with a short stack", BreakReason.EXCEPTION)
    exc = tx.realize(tx.stack[-1])
    if not isinstance(exc, ExceptionVariable):
        unsupported(f"exception inside a with block: {exc.describe()}", BreakReason.EXCEPTION)
    exit_fn = tx.realize(tx.stack[-4])
    result = exit_fn.call_function(tx, [build_unsourced(exc.cls), exc, TracebackVariable()], {})
    tx.push(result)

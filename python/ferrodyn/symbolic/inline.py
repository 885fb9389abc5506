"""Inlining a user function call: a child InstructionTranslator on the callee's code, sharing
the OutputGraph, with the callee's globals (and their Sources) and closure cells.

Owns the inlining policy: depth limit (in the translator); a generator function (a plain
function, a method, an `__iter__` written as a generator, a generator expression) is not run
at the call: the call returns a `GeneratorVariable` whose body runs lazily when it is consumed
(variables/generators.py); coroutines and async generators are refused.
Does not own argument binding (variables/functions.py).
"""

from __future__ import annotations

import inspect

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported

_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def inline_function(tx, fn, bound: dict[str, VariableTracker]) -> VariableTracker:
    from ferrodyn.symbolic.translator import InstructionTranslator
    code = fn.code()
    if code.co_flags & _ASYNC_FLAGS:
        unsupported(f"calling coroutine/async generator function {code.co_name}",
                    BreakReason.GENERATOR)
    _note(tx, code)
    if code.co_flags & inspect.CO_GENERATOR:
        from ferrodyn.variables.generators import GeneratorVariable
        return GeneratorVariable.make(tx, fn, bound)
    closure = fn.closure(tx)
    if len(closure) != len(code.co_freevars):
        unsupported(f"closure of {code.co_name} does not match its code", BreakReason.OTHER)
    cells = dict(zip(code.co_freevars, closure))
    child = InstructionTranslator(code, fn.fn_globals(), tx.output, dict(bound), cells,
                                  fn.globals_source(tx), parent=tx)
    return child.run()


def _note(tx, code) -> None:
    note = f"inlined {code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
    if note not in tx.output.notes:
        tx.output.notes.append(note)

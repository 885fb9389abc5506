"""Inlining a user function call: a child InstructionTranslator on the callee's code, sharing
the OutputGraph, with the callee's globals (and their Sources) and closure cells.

Owns the inlining policy: depth limit (in the translator), generator functions refused except
generator expressions, which are run to completion (their values collected into an iterator).
Does not own argument binding (variables/functions.py).
"""

from __future__ import annotations

import inspect

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.lists import IteratorVariable

_GEN_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR \
    | inspect.CO_ITERABLE_COROUTINE


def inline_function(tx, fn, bound: dict[str, VariableTracker]) -> VariableTracker:
    from ferrodyn.symbolic.translator import InstructionTranslator
    code = fn.code()
    collect = False
    if code.co_flags & _GEN_FLAGS:
        if code.co_name != "<genexpr>" or not code.co_flags & inspect.CO_GENERATOR:
            unsupported(f"calling generator/coroutine function {code.co_name}",
                        BreakReason.GENERATOR)
        collect = True
    closure = fn.closure(tx)
    if len(closure) != len(code.co_freevars):
        unsupported(f"closure of {code.co_name} does not match its code", BreakReason.OTHER)
    cells = dict(zip(code.co_freevars, closure))
    note = f"inlined {code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
    if note not in tx.output.notes:
        tx.output.notes.append(note)
    child = InstructionTranslator(code, fn.fn_globals(), tx.output, dict(bound), cells,
                                  fn.globals_source(tx), parent=tx)
    if collect:
        child.yields = []
        child.run()
        return IteratorVariable.over(child.yields)
    return child.run()

"""The symbolic converter: turns one frame into one torch.fx graph, or raises Unsupported.

Owns the entry point `trace_frame` used by the frontend (convert_frame.py): it wraps the
frame's argument slots and closure cells as lazy trackers with Sources, runs the
InstructionTranslator (translator.py) over the bytecode, and returns the OutputGraph's
TraceResult. Real global state touched while tracing (grad mode, autocast) is always
restored. Does not own compiling the graph, the guards, or the entry function (frontend).
"""

from __future__ import annotations

import inspect
import types

import torch

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.source import ClosureSource, GlobalSource, LocalSource
from ferrodyn.trace_result import TraceResult

# Register every handler family (import order does not matter).
from ferrodyn.symbolic import (  # noqa: F401
    opcodes_build, opcodes_call, opcodes_control, opcodes_load_store, opcodes_ops,
    opcodes_stack, exceptions,
)

_GEN_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR \
    | inspect.CO_ITERABLE_COROUTINE


def _n_arg_slots(code: types.CodeType) -> int:
    n = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        n += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        n += 1
    return n


def trace_frame(code: types.CodeType, f_globals: dict, f_builtins: dict, args: tuple,
                closure: tuple | None, *, fullgraph: bool = False) -> TraceResult:
    """Capture the frame of `code` called with argument slots `args` (co_varnames order) and
    closure cells `closure` (co_freevars order) as one graph. Raises `Unsupported`."""
    from ferrodyn.output_graph import OutputGraph
    from ferrodyn.symbolic.translator import InstructionTranslator
    from ferrodyn.variables.base import LazyVariable
    from ferrodyn.variables.functions import CellState, CellVariable

    if code.co_flags & _GEN_FLAGS:
        raise Unsupported(f"generator/coroutine frame {code.co_name}", BreakReason.GENERATOR,
                          filename=code.co_filename, lineno=code.co_firstlineno)
    n = _n_arg_slots(code)
    if len(args) != n:
        raise TypeError(f"trace_frame: {code.co_name} has {n} argument slots, got {len(args)}")
    names = code.co_varnames
    local_vars = {names[i]: LazyVariable(source=LocalSource(i, names[i]), value=v)
                  for i, v in enumerate(args)}
    cells = {}
    for i, name in enumerate(code.co_freevars):
        cell = closure[i]
        try:
            content = LazyVariable(source=ClosureSource(i, name), value=cell.cell_contents)
        except ValueError:
            content = None
        cells[name] = CellVariable(state=CellState(content, existing=True))

    output = OutputGraph(f_globals, f_builtins)
    grad = torch.is_grad_enabled()
    try:
        tx = InstructionTranslator(code, f_globals, output, local_vars, cells, GlobalSource)
        value = tx.run()
        result = output.build_result(tx, value)
    finally:
        output.close()
        torch._C._set_grad_enabled(grad)
    return result


__all__ = ["trace_frame"]

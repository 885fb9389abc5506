"""The symbolic converter: turns one frame into one torch.fx graph, or raises Unsupported.

Owns the entry point `trace_frame` used by the frontend (convert_frame.py): it wraps the
frame's argument slots and closure cells as lazy trackers with Sources, runs the
InstructionTranslator (translator.py) over the bytecode, and returns the OutputGraph's
TraceResult (or, at a graph break, traces again up to the breaking instruction and hands
over to resume.capture_break). Real global state touched while tracing (grad mode, autocast)
is always restored. Does not own compiling the graph, the guards, or the entry function (frontend).
"""

from __future__ import annotations

import inspect
import types

import torch

from ferrodyn.exc import BreakReason, RestartAnalysis, Unsupported
from ferrodyn.source import ClosureSource, GlobalSource, LocalSource
from ferrodyn.trace_result import TraceResult

# Register every handler family (import order does not matter).
from ferrodyn.symbolic import (  # noqa: F401
    exceptions, opcodes_313, opcodes_build, opcodes_call, opcodes_control, opcodes_load_store,
    opcodes_ops, opcodes_stack, opcodes_with,
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


_MAX_RESTARTS = 8


def trace_frame(code: types.CodeType, f_globals: dict, f_builtins: dict, args: tuple,
                closure: tuple | None, *, fullgraph: bool = False) -> TraceResult:
    """Capture the frame of `code` called with argument slots `args` (co_varnames order) and
    closure cells `closure` (co_freevars order) as one graph. Raises `Unsupported`.

    Graph breaks (not `fullgraph`): when an instruction of the root frame itself cannot be
    captured (a call, including one into an inlined function that breaks, or a conditional
    jump on a tensor), the frame is traced again up to that instruction and the result
    describes a graph break (`TraceResult.graph_break`, see resume.py); when the break cannot
    be resumed exactly, the original `Unsupported` is raised."""
    from ferrodyn.output_graph import OutputGraph
    from ferrodyn.symbolic.translator import InstructionTranslator, StopAtBreak
    from ferrodyn.variables.base import LazyVariable
    from ferrodyn.trace_result import OutCell
    from ferrodyn.exc import RaisedWhileTracing
    from ferrodyn.variables.exceptions import TracedException
    from ferrodyn.variables.functions import existing_cell

    if code.co_flags & _GEN_FLAGS:
        raise Unsupported(f"generator/coroutine frame {code.co_name}", BreakReason.GENERATOR,
                          filename=code.co_filename, lineno=code.co_firstlineno)
    n = _n_arg_slots(code)
    if len(args) != n:
        raise TypeError(f"trace_frame: {code.co_name} has {n} argument slots, got {len(args)}")
    names = code.co_varnames
    local_vars = {names[i]: LazyVariable(source=LocalSource(i, names[i]), value=v)
                  for i, v in enumerate(args)}
    def run(stop_at=None):
        for _ in range(_MAX_RESTARTS):
            try:
                return run_once(stop_at)
            except RestartAnalysis:  # the trace changed what it reads (a lazy module initialized)
                continue
        raise Unsupported(f"{code.co_name}: the trace restarted {_MAX_RESTARTS} times",
                          BreakReason.UNSUPPORTED_CALL, filename=code.co_filename,
                          lineno=code.co_firstlineno)

    def run_once(stop_at=None):
        output = OutputGraph(f_globals, f_builtins)
        from ferrodyn.resume import autocast_state
        grad, autocast = torch.is_grad_enabled(), autocast_state()
        # Each trace (a restart too) starts from the frame's values: cells are tracked afresh
        # by this trace's side-effects table, so a first trace's cell writes are not seen.
        tx = InstructionTranslator(code, f_globals, output, dict(local_vars), {}, GlobalSource)
        tx.stop_at = stop_at
        try:
            for i, name in enumerate(code.co_freevars):
                tx.cells[name] = existing_cell(tx, closure[i], None, ClosureSource(i, name),
                                               OutCell(i))
            try:
                value = tx.run()
            except StopAtBreak as stop:
                from ferrodyn.resume import capture_break
                return capture_break(stop.tx, first_exc[0], autocast, grad)
            return output.build_result(tx, value)
        finally:
            output.close()
            torch._C._set_grad_enabled(grad)

    first_exc: list[Unsupported] = []
    try:
        return run()
    except Unsupported as e:
        path = e.__dict__.pop("break_path", None) or []
        if fullgraph or not path or isinstance(e, TracedException) or (
                isinstance(e, RaisedWhileTracing) and not _covered_by_handler(path)):
            # An exception the trace raised and no handler of the frame catches: the frame
            # runs eagerly (torch.compile's "observed exception"). A break at the raising
            # instruction would run it after a prefix traced with `is_compiling()` true, so
            # code that avoids the error only when not compiling would raise.
            raise
        from ferrodyn.resume import breakable
        # Restart: trace again up to the breaking instruction and capture the break there:
        # inside the inlined calls (every level resumes), else at the root frame's call.
        stops = [[(t.code, index, visit) for t, index, visit in p]
                 for p in ([path, path[:1]] if len(path) > 1 else [path])
                 if breakable(p[-1][0].instructions[p[-1][1]].opname)]
        first_exc.append(e)
        for stop in stops:
            try:
                return run(stop_at=stop)
            except Unsupported as again:
                if again is not e:
                    e.__dict__.setdefault("resume_refusals", []).append(str(again))
                # the capture up to the break is refused at an earlier call it names (a
                # requires_grad_ leaf leaving the graph, variables/requires_grad.py): break there
                earlier = again.__dict__.pop("reroute_path", None)
                if earlier:
                    try:
                        return run(stop_at=[(t.code, index, visit) for t, index, visit in earlier])
                    except Unsupported as third:
                        e.__dict__.setdefault("resume_refusals", []).append(str(third))
        raise


def _covered_by_handler(path) -> bool:
    """Whether an exception at the breaking instruction would meet a handler (`except`,
    `finally`, a `with`'s cleanup) in one of the traced frames of `path` (root first)."""
    import dis
    for t, index, _ in path:
        offset = t.instructions[index].offset
        if any(e.start <= offset < e.end for e in dis._parse_exception_table(t.code)):
            return True
    return False


__all__ = ["trace_frame"]

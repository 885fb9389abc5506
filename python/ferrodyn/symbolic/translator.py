"""InstructionTranslator: runs one code object's bytecode over variable trackers.

Owns the frame state of a symbolic execution (value stack, locals, cells, instruction
pointer, pending KW_NAMES), the stepping loop, value realization (a `LazyVariable` reaching
the stack is built, and thereby guarded, through the builder) and the user-facing location of
an `Unsupported` (the innermost instruction's file and line). It also counts the root frame's steps per instruction and
can stop before a given (instruction, visit) for a graph break (`StopAtBreak`). Does not own
what each opcode does (opcodes_*.py, registered by name in registry.py), inlining policy
(inline.py), the graph (output_graph.py) or what a break does (resume.py).

Call hierarchy (each level is an override point, as in torch.fx.Interpreter):

    trace_frame(code, f_globals, f_builtins, args, closure)        symbolic/__init__.py
      └─ InstructionTranslator.run()                                this module
           └─ step(inst) ─► handler_for(inst.opname)(tx, inst)       opcodes_*.py
                ├─ tx.push(v) ─► tx.realize(lazy) ─► builder.build(value, source) ─► guards
                ├─ tracker.var_getattr / call_function / call_method / getitem / unpack ...
                │    ├─ record_op(kind, target, args) ─► fake execution ─► OutputGraph node
                │    └─ InlinableFunction.call_function ─► inline_function (inline.py)
                │         └─ child InstructionTranslator(parent=tx).run()   (same OutputGraph)
                └─ RETURN_VALUE / RETURN_CONST ─► tx.returned
      └─ OutputGraph.build_result(tx, returned) ─► TraceResult
"""

from __future__ import annotations

import types
from typing import Any, Callable

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.output_graph import OutputGraph
from ferrodyn.source import BuiltinSource, Source
from ferrodyn.symbolic.instructions import Instruction, decode
from ferrodyn.symbolic.registry import handler_for
from ferrodyn.variables.base import LazyVariable, NullVariable, VariableTracker, unsupported
from ferrodyn.variables.exceptions import TracedException
from ferrodyn.variables.functions import CellState, CellVariable

MAX_INLINE_DEPTH = 48
_RETURNED_NOTHING = object()


class StopAtBreak(Exception):
    """Control-flow signal (not an error): a translator reached the instruction it was asked
    to stop before (`stop_at`), with its state (and its parents') intact, for a graph break."""

    def __init__(self, tx: "InstructionTranslator"):
        super().__init__()
        self.tx = tx


class InstructionTranslator:
    def __init__(self, code: types.CodeType, f_globals: dict, output: OutputGraph,
                 local_vars: dict[str, VariableTracker], cells: dict[str, CellVariable],
                 globals_source: Callable[[str], Source | None],
                 parent: "InstructionTranslator | None" = None):
        self.code = code
        self.f_globals = f_globals
        self.output = output
        self.locals = local_vars
        self.cells = cells
        self.globals_source = globals_source
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        if self.depth > MAX_INLINE_DEPTH:
            unsupported(f"inlining {code.co_name} at depth {self.depth}",
                        BreakReason.RECURSION_LIMIT)
        self.instructions: list[Instruction] = decode(code)
        self.stack: list[VariableTracker] = []
        self.exc_stack: list[VariableTracker] = []  # exceptions being handled (sys.exc_info)
        self.ip = 0
        self.current: Instruction | None = None
        self.kw_names: tuple[str, ...] = ()
        self.returned: Any = _RETURNED_NOTHING
        self.generator = None  # the GeneratorFrame whose body this runs (variables/generators.py)
        self.yielded: VariableTracker | None = None  # set by YIELD_VALUE (a generator stops)
        self.graph_output = None  # set by OutputGraph.build_result
        # graph breaks: how often each instruction index was stepped; the path of
        # (code, index, visit) to stop before, this level first (resume.capture_break then
        # reads the state); the rest of the path for the function the current step inlines
        # and that step's inputs.
        self.visits: dict[int, int] = {}
        self.stop_at: list[tuple[types.CodeType, int, int]] | None = None
        self.child_stop: list | None = None
        self.stop_call_inputs: list[VariableTracker] | None = None
        if parent is not None and parent.child_stop and parent.child_stop[0][0] is code:
            self.stop_at, parent.child_stop = parent.child_stop, None

    # -- running --------------------------------------------------------------------------
    def run(self) -> VariableTracker:
        while self.returned is _RETURNED_NOTHING:
            if self.ip >= len(self.instructions):
                unsupported("ran off the end of the bytecode", BreakReason.OTHER)
            inst = self.instructions[self.ip]
            n = self.visits[self.ip] = self.visits.get(self.ip, 0) + 1
            if self.stop_at is not None:
                self._check_stop(inst, n)
            self.ip += 1
            self.current = inst
            try:
                self.step(inst)
            except Unsupported as e:
                # the path of (translator, index, visit) to the breaking instruction, root first
                path = e.__dict__.setdefault("break_path", [])
                path.insert(0, (self, self.ip - 1, n))
                raise
        return self.returned

    def _check_stop(self, inst: Instruction, visit: int) -> None:
        self.child_stop = None
        _, index, want = self.stop_at[0]
        if (index, want) != (self.ip, visit):
            return
        if len(self.stop_at) == 1:
            self.current = inst
            raise StopAtBreak(self)
        from ferrodyn.resume import n_inputs
        self.child_stop = self.stop_at[1:]
        self.stop_call_inputs = list(self.stack[len(self.stack) - n_inputs(inst):])

    def step(self, inst: Instruction) -> None:
        handler = handler_for(inst.opname)
        try:
            if handler is None:
                from ferrodyn.symbolic.opcodes_unsupported import refuse
                refuse(inst)
            handler(self, inst)
        except TracedException as e:  # raised here or in an inlined call: this frame's handler
            from ferrodyn.symbolic.exceptions import unwind
            unwind(self, e)
        except Unsupported as e:
            if e.filename is None:
                raise e.at(self.code.co_filename, inst.lineno) from e
            raise
        except RecursionError:
            raise Unsupported(f"recursion while tracing {self.code.co_name}",
                              BreakReason.RECURSION_LIMIT, filename=self.code.co_filename,
                              lineno=inst.lineno) from None

    def jump(self, inst: Instruction) -> None:
        assert inst.target is not None, inst
        self.ip = inst.target

    @property
    def lineno(self) -> int | None:
        return self.current.lineno if self.current else None

    # -- stack ----------------------------------------------------------------------------
    def realize(self, v: VariableTracker) -> VariableTracker:
        if isinstance(v, LazyVariable):
            from ferrodyn.variables.builder import build
            return build(self, v.value, v.source)
        return v

    def push(self, v: VariableTracker) -> None:
        self.stack.append(self.realize(v))

    def pop(self) -> VariableTracker:
        return self.stack.pop()

    def popn(self, n: int) -> list[VariableTracker]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def peek(self, depth: int = 1) -> VariableTracker:
        return self.stack[-depth]

    # -- names ----------------------------------------------------------------------------
    def load_global(self, name: str) -> VariableTracker:
        from ferrodyn.side_effects import DELETED
        from ferrodyn.variables.builder import build
        pending = self.output.side_effects.pending_global(self.f_globals, name)
        if pending is not None and pending is not DELETED:
            return pending  # stored earlier in this trace (STORE_GLOBAL)
        if pending is None and name in self.f_globals:
            return build(self, self.f_globals[name], self.globals_source(name))
        builtins = self.output.f_builtins
        if name in builtins:
            return build(self, builtins[name], BuiltinSource(name))
        unsupported(f"NameError: name {name!r} is not defined", BreakReason.EXCEPTION)

    def cell(self, name: str) -> CellVariable:
        cell = self.cells.get(name)
        if cell is None:
            cell = self.cells[name] = CellVariable(state=CellState())
        return cell

    def zero_arg_super(self) -> tuple[type, VariableTracker]:
        cls_cell = self.cells.get("__class__")
        if cls_cell is None or self.code.co_argcount == 0:
            unsupported("super() without __class__ cell", BreakReason.UNSUPPORTED_BUILTIN)
        cls = self.realize(cls_cell.load(self, "__class__")).as_python_constant()
        first = self.code.co_varnames[0]
        obj = self.locals.get(first)
        if obj is None and first in self.cells:
            obj = self.cells[first].load(self, first)
        if obj is None:
            unsupported("super(): first argument unbound", BreakReason.EXCEPTION)
        return cls, self.realize(obj)


def is_null(v: VariableTracker) -> bool:
    return isinstance(v, NullVariable)

"""Graph breaks that resume: what happens at an instruction the converter cannot capture.

Owns (one module each: capture.py, code.py, emit.py, loops.py, stack_ops.py; re-exported here):
- `capture_break(tx, exc)`: at the breaking instruction (the translator stopped just before
  it; when it is inside inlined calls, every enclosing translator is stopped inside its call),
  decide whether the state of every level can be rebuilt exactly, and if so turn it into a
  `TraceResult` whose `graph_break` (a `GraphBreak`, with an `OuterFrame` per enclosing
  level) says how the entry continues: the live stack (NULLs included) and locals as `Out`
  specs, the grad mode at the break, the instruction to run eagerly. It refuses (re-raises
  `exc`: the caller then tries a break at the root frame's call, else the frame runs eagerly
  as before) when it is not sure: a level inside an exception handler's body (`try` and
  `with` blocks around any level are fine: an exception from the instruction run at the
  break continues in a resume function starting at the innermost level's handler, and an
  enclosing level's resume prologue makes its call under the handler around it), an
  autocast `with` around an enclosing level's call, autocast changed otherwise than by the
  breaking level's live autocast `with` blocks (the graph exits those, the entry runs the
  instruction inside them, the resume function enters them again), a new iterator
  reachable twice (new lists, dicts and sets live in two places are rebuilt once and
  referenced twice), a live value it cannot rebuild, an enclosing call that is not a plain
  call of a user function. Each resumed break is logged once on the `graph_breaks` channel.
- `resume_code(code, offset, nulls, unbound)`: the resume function's code, built with
  `ferrodyn.bytecode` from the *original* code: a prologue takes every local of the original
  (in co_varnames order), its cell objects (co_cellvars + co_freevars order: frames with cell
  variables and closures, inlined or not, resume sharing their cells with the functions made
  before the break), then the non-NULL stack values as positional arguments, deletes the
  locals that were unbound, stores the cells into their slots, pushes the stack back
  (PUSH_NULL for NULLs) and jumps to `offset`. Cached per (code, offset, stack shape, unbound locals), so recompiles reuse it.
  Resume functions are ordinary frames for the hook: they get their own cache entries.
- `emit_break(emitter, brk)`: the entry's instructions after the graph call: set the grad
  mode of the break, push the resume function, the stack, run the instruction (a call, or the
  conditional jump choosing between two resume functions), store the stack, push the locals,
  call the resume function. For nested breaks the innermost resume function is not called
  there: the root's resume function is, with the next level's resume function and argument
  tuple as two more arguments (and so on inwards); its prologue calls them, so tracing it
  inlines every level and what follows the break is one graph (torch's nested graph breaks).
  An exception from the instruction run at the break continues in a resume function that
  starts at the frame's own handler (`try`, `with` cleanups).
- `LoopRest` (loops.py): a `for` loop's iterator handed to a resume function, iterated lazily
  so that a loop body's resume function reaches a steady state; `LiveRest` (live_rest.py): one
  over a live list (or a zip/enumerate of such), in parts the builder models.
- `STACK_OPS` (stack_ops.py): the instructions other than calls and jumps a break can run in
  the entry (attribute reads and writes, subscripts, operators, formatting, unpacking on values
  the converter does not model): their inputs, the stack shape they leave, their emission.

Does not own tracing (symbolic/), the graph (output_graph.py) or the entry's graph call
(codegen.py).
"""

from ferrodyn.resume.capture import (  # noqa: F401
    AutocastReenter, GradModeRestore, GraphBreak, OuterFrame, autocast_state, breakable,
    capture_break, n_inputs, reset_state,
)
from ferrodyn.resume.code import (  # noqa: F401
    ITER, NULL, VALUE, _ORIGIN, _RESUME_CODES, origin, prologue_call, resume_code,
)
from ferrodyn.resume.emit import emit_break  # noqa: F401
from ferrodyn.resume.loops import LoopRest, build_loop_rest  # noqa: F401
from ferrodyn.resume.live_rest import LiveRest, build_live_rest  # noqa: F401

"""The entry's continuation after its graph at a graph break.

Owns `emit_break` (see the package docstring): grad mode, the instruction run eagerly (or
None for a no-op break marker), the resume function's call (or, for nested breaks, the
root's, handed the inner levels' continuations), an exception from the instruction sent to
the frame's own handler (`_on_exception`), and the resume function objects (one per
(resume code, globals)). A resume function without closure is called through
`_C.resume_call(fn)`: on a hit of its cache the entry runs without a frame of fn. Does not own the graph call (codegen.py) or the resume code (code.py).
"""

from __future__ import annotations

import dataclasses
import sys
import types
import weakref
from typing import Any

import torch

from ferrodyn import _C, bytecode
from ferrodyn.resume.capture import GraphBreak
from ferrodyn.resume.code import (ITER, NULL, VALUE, inst_at, jump_target_offset,
                                  next_offset, resume_code)
from ferrodyn.resume.stack_ops import STACK_OPS
from ferrodyn.trace_result import Out, OutShared

_VERSION = sys.version_info[:2]


def _resume_function(e, brk, offset: int, shape: tuple[int, ...], nested_call: int | None = None,
                     raise_at: int | None = None):
    """The resume function of `brk` (a GraphBreak or an OuterFrame) continuing at `offset`:
    one function object per (resume code, globals), so that a nested resume function handed
    to an enclosing level's (which guards its identity) is the same object for every entry."""
    unbound = frozenset(i for i, v in enumerate(brk.locals) if v is None)
    code = resume_code(brk.code, offset, shape, unbound, nested_call, raise_at)
    f_globals = brk.f_globals if brk.f_globals is not None else e.globals["__ferrodyn_G"]
    key = (id(code), id(f_globals))
    fn = _RESUME_FUNCTIONS.get(key)
    if fn is None or fn.__code__ is not code or fn.__globals__ is not f_globals:
        # a closure's stands for its code and globals: the entry makes one per call with the
        # frame's cells (`_load_resume`); these empty cells are never read
        cells = tuple(types.CellType() for _ in code.co_freevars) or None
        fn = types.FunctionType(code, f_globals, code.co_name, None, cells)
        _RESUME_FUNCTIONS[key] = fn
    return fn


# (id(resume code), id(globals)) -> function; an entry lives as long as some compiled entry
# binds the function (which keeps the code and the globals, hence the ids, alive).
_RESUME_FUNCTIONS: "weakref.WeakValueDictionary[tuple[int, int], types.FunctionType]" = \
    weakref.WeakValueDictionary()



# ---------------------------------------------------------------------------------------------
# The entry's continuation
# ---------------------------------------------------------------------------------------------

def _set_grad(e, mode: bool) -> None:
    e.load_callable(torch._C._set_grad_enabled)
    e.load_value(bool(mode))
    e.call(1)
    e.emit(e.inst("POP_TOP"))


def _call_resume(e, brk, n_stack: int) -> None:
    """Stack: [resume (with its NULL), n_stack values]: call it with (locals, stack) and
    return its result."""
    temps = _store(e, n_stack)
    _push_locals(e, brk)
    for t in temps:
        e.emit(e.b.load_fast(t))
    e.call(len(brk.locals) + n_stack)
    e.ret()


def _load_resume(e, fn) -> None:
    """The resume function as a callable (with its NULL). A closure's is made for this call
    with the frame's own cells (`FunctionType(code, globals, name, None, cells)`), so that it
    reads and writes the same cells as the frame it continues."""
    code = fn.__code__
    if not code.co_freevars:
        # called through `_C.resume_call`: a hit of its cache runs the entry without a frame
        # of the resume function (anything else calls fn itself)
        e.load_callable(_C.resume_call(fn))
        return
    e.emit(*e.b.call_prefix())
    e.load_callable(types.FunctionType)
    e.load_value(code)
    e.load_value(fn.__globals__)
    e.load_value(code.co_name)
    e.emit(e.b.load_const(None))
    for j in range(len(code.co_freevars)):
        e.emit(e.b.load_fast(e.cell_names[j]))
    e.emit(e.inst("BUILD_TUPLE", len(code.co_freevars)))
    e.call(5)
    e.emit(*e.b.call_infix())


def _store(e, n: int) -> list[str]:
    """Pop the top `n` values into fresh locals (bottom first)."""
    temps = [e.temp("s") for _ in range(n)]
    for t in reversed(temps):
        e.emit(e.b.store_fast(t))
    return temps


def _push_locals(e, frame) -> None:
    for v in frame.locals:
        if v is None:
            e.emit(e.b.load_const(None))  # unbound: the prologue deletes it
        else:
            e.emit_out(v)


def _continue(e, brk: GraphBreak, fn, n_stack: int) -> None:
    """Stack: n_stack values of the breaking frame's stack after the instruction (with `fn`,
    its resume function, loaded below them with its NULL when the break is not nested).
    Return what the root frame would: the resume function's result, or, for a nested break,
    the result of the root's resume function, whose prologue calls the next level's with
    the next level's arguments, and so on down to `fn` (see `resume_code`)."""
    if not brk.outer:
        _call_resume(e, brk, n_stack)
        return
    temps = _store(e, n_stack)
    _push_locals(e, brk)
    for t in temps:
        e.emit(e.b.load_fast(t))
    e.emit(e.inst("BUILD_TUPLE", len(brk.locals) + n_stack))
    inner_fn = fn
    for depth in range(len(brk.outer) - 1, -1, -1):
        frame = brk.outer[depth]
        args = e.temp("nested")
        e.emit(e.b.store_fast(args))
        shape = tuple(NULL if v is None else ITER if it else VALUE
                      for v, it in zip(frame.stack, frame.iters))
        resume_fn = _resume_function(e, frame, next_offset(frame.code, frame.offset), shape,
                                     nested_call=frame.offset)
        if depth == 0:
            _load_resume(e, resume_fn)
        _push_locals(e, frame)
        _push(e, frame.stack)
        e.load_value(inner_fn)
        e.emit(e.b.load_fast(args))
        n = len(frame.locals) + sum(1 for v in frame.stack if v is not None) + 2
        if depth == 0:
            e.call(n)
        else:
            e.emit(e.inst("BUILD_TUPLE", n))
        inner_fn = resume_fn
    e.ret()


def _push(e, values) -> None:
    for v in values:
        if v is not None:
            e.emit_out(v)


def _materialise_shared(e, brk: GraphBreak) -> None:
    """Evaluate every OutShared among the live values (a new object live in two places) once,
    before the breaking instruction: both places, on every path out of it, then refer to
    that one object (and see what the instruction does to it)."""
    found: list = []

    def walk(o):
        if isinstance(o, OutShared):
            found.append(o)
        if dataclasses.is_dataclass(o):
            for f in dataclasses.fields(o):
                v = getattr(o, f.name)
                for item in (v if isinstance(v, tuple) else (v,)):
                    if isinstance(item, Out):
                        walk(item)

    for frame in (*brk.outer, brk):
        for o in (*frame.stack, *frame.locals):
            if o is not None:
                walk(o)
    for o in found:
        if o.key not in e.shared:
            e.emit_out(o)
            e.emit(e.inst("POP_TOP"))


def emit_break(e, brk: GraphBreak, _unused: Any = None) -> None:
    _materialise_shared(e, brk)
    if brk.set_grad:
        _set_grad(e, brk.grad_mode)
    n_low = len(brk.stack) - brk.n_inputs
    lower, inputs = brk.stack[:n_low], brk.stack[n_low:]
    if any(brk.iters[n_low:]):
        raise TypeError("codegen: an iterator among a breaking instruction's inputs")
    nulls = tuple(NULL if v is None else ITER if it else VALUE
                  for v, it in zip(lower, brk.iters))
    n_lower = sum(1 for v in lower if v is not None)
    nested = bool(brk.outer)  # the resume function is an argument, not called here
    if brk.kind in ("call", "op"):
        op = inst_at(bytecode.decode(brk.code), brk.offset) if brk.kind == "op" else None
        outs = STACK_OPS[brk.opname].outputs(brk.code, op) if op is not None else (VALUE,)
        n_out = sum(1 for k in outs if k != NULL)
        fn = _resume_function(e, brk, next_offset(brk.code, brk.offset), nulls + outs)
        if not nested:
            _load_resume(e, fn)
        _push(e, lower)
        if brk.noop:
            e.emit(e.b.load_const(None))
            _continue(e, brk, fn, n_lower + 1)
            return
        for v in inputs:
            if v is None:
                e.emit(e.inst("PUSH_NULL"))
            else:
                e.emit_out(v)
        start = len(e.insts)
        if op is not None:
            STACK_OPS[brk.opname].emit(e, brk.code, op)
        elif brk.opname == "CALL":
            e.call(brk.arg, brk.kw_names)
        else:
            e.emit(e.inst(brk.opname, brk.arg))
        if brk.handler is not None:
            _on_exception(e, brk, start)
        elif brk.grad_on_error is not None:
            _protect(e, start, brk.grad_on_error)
        _continue(e, brk, fn, n_lower + n_out)
        return
    # a conditional jump on a value only known when the graph has run
    fn_next = _resume_function(e, brk, next_offset(brk.code, brk.offset), nulls)
    fn_jump = _resume_function(e, brk, jump_target_offset(brk.code, brk.offset), nulls)
    e.emit_out(inputs[0])
    start = len(e.insts)
    if _VERSION >= (3, 13):
        e.emit(e.inst("TO_BOOL"))
    jump = e.inst(brk.opname.replace("BACKWARD", "FORWARD"))
    e.emit(jump)
    if brk.handler is not None:  # the truth of the value can raise (a tensor of many items)
        _on_exception(e, brk, start)
    for k, fn in enumerate((fn_next, fn_jump)):
        first = len(e.insts)
        if not nested:
            _load_resume(e, fn)
        _push(e, lower)
        _continue(e, brk, fn, n_lower)
        if k == 1:
            jump.target = e.insts[first]


def _on_exception(e, brk: GraphBreak, start: int) -> None:
    """An exception from the instructions since `start` (the one run at the break) continues
    in the frame's own handler, as in eager: the handler's resume function gets the stack
    below the handler's depth and the exception (and returns, or raises, what the frame
    would). The entry's stack is empty before the break's instructions, so the entry's
    handler starts with just the exception."""
    target, depth, _ = brk.handler
    below = brk.stack[:depth]
    shape = tuple(NULL if v is None else ITER if it else VALUE
                  for v, it in zip(below, brk.iters)) + (VALUE,)
    fn = _resume_function(e, brk, target, shape, raise_at=brk.offset)
    body, e.insts = e.insts, []
    exc_tmp = e.temp("exc")
    first = e.b.store_fast(exc_tmp)
    e.emit(first)
    if not brk.outer:
        _load_resume(e, fn)
    _push(e, below)
    e.emit(e.b.load_fast(exc_tmp))
    _continue(e, brk, fn, sum(1 for v in below if v is not None) + 1)
    handler, e.insts = e.insts, body
    on_error = bytecode.ExnHandler(first, 0, False)
    for i in e.insts[start:]:
        i.exn = on_error
    e.tail += handler


def _protect(e, start: int, grad_mode: bool) -> None:
    """An exception from the instructions since `start` leaves grad mode as the enclosing
    `with` blocks would (`grad_mode`), then propagates."""
    handler = [e.inst("PUSH_EXC_INFO")]
    e_insts = e.insts
    e.insts = handler
    _set_grad(e, grad_mode)
    e.insts = e_insts
    handler.append(e.inst("RERAISE", 0))
    cleanup = [e.inst("COPY", 3), e.inst("POP_EXCEPT"), e.inst("RERAISE", 1)]
    on_error = bytecode.ExnHandler(handler[0], 0, False)
    on_cleanup = bytecode.ExnHandler(cleanup[0], 1, True)
    for i in e.insts[start:]:
        i.exn = on_error
    for i in handler:
        i.exn = on_cleanup
    e.tail += handler + cleanup


"""Capturing a graph break: is the state at the breaking instruction rebuildable exactly?

Owns `capture_break` (see the package docstring), the refusals, the live values of every
level (`_Level`, `OuterFrame`), the `GraphBreak` record the entry is generated from, and the
`graph_breaks` log records. Does not own the resume code (code.py) or the entry (emit.py).
"""

from __future__ import annotations

import logging
import operator
import sys
import types
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ferrodyn import bytecode
from ferrodyn.exc import Unsupported
from ferrodyn.resume.code import inst_at, origin, prologue_call
from ferrodyn.resume.loops import iterator_refusal, rebuild_iterator
from ferrodyn.resume.stack_ops import STACK_OPS
from ferrodyn.side_effects import MutationType
from ferrodyn.trace_result import (
    Out, OutCall, OutConst, OutList, OutShared, OutTuple, TraceResult,
)

_VERSION = sys.version_info[:2]
_CALLS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX"})
_JUMPS = frozenset(f"POP_JUMP_{d}IF_{c}" for d in ("", "FORWARD_", "BACKWARD_") for c in ("TRUE", "FALSE"))

@dataclass
class GraphBreak:
    """How an entry continues after its graph: see the module docstring."""
    code: types.CodeType
    kind: str                          # "call", "jump" or "op" (stack_ops.STACK_OPS)
    opname: str                        # the breaking instruction
    arg: int
    offset: int                        # its byte offset (as `dis` reports it)
    stack: tuple[Out | None, ...]      # the whole stack before it, bottom first; None: NULL
    iters: tuple[bool, ...]            # per stack value: an iterator passed as a tuple of its rest
    n_inputs: int                      # how many of the top values it consumes
    kw_names: tuple[str, ...]          # pending KW_NAMES (3.11, 3.12)
    locals: tuple[Out | None, ...]     # co_varnames order; None: unbound
    grad_mode: bool                    # grad mode at the break
    grad_on_error: bool | None         # grad mode an exception leaves behind (enclosing no_grad)
    reason: Unsupported
    lineno: int | None
    f_globals: dict | None = None      # the globals of `code` (an inlined function's own)
    outer: tuple = ()                  # OuterFrame per enclosing frame, root first (nested breaks)
    handler: tuple | None = None       # (target, depth, lasti) of the exception handler around it
    set_grad: bool = True              # the entry sets grad_mode (False: it is the guarded one)
    noop: bool = False                 # the call does nothing (a break marker): its result is None


class GradModeRestore:
    """Stands for a grad-mode context manager's `__exit__` across a break: restores the mode
    the `with` was entered under, never suppresses the exception."""

    def __init__(self, prev: bool):
        self.prev = prev

    def __call__(self, *exc_info: Any) -> bool:
        torch._C._set_grad_enabled(self.prev)
        return False


# ---------------------------------------------------------------------------------------------
# Capture (at trace time)
# ---------------------------------------------------------------------------------------------

def breakable(opname: str) -> bool:
    return opname in _CALLS or opname in _JUMPS or opname in STACK_OPS


def _refuse(exc: Unsupported, why: str):
    exc.add_note(f"ferrodyn: not resuming after this break: {why}") if hasattr(exc, "add_note") else None
    raise exc


def n_inputs(inst) -> int:
    if inst.opname == "CALL":
        return inst.arg + 2
    if inst.opname == "CALL_KW":
        return inst.arg + 3
    if inst.opname == "CALL_FUNCTION_EX":
        return 3 + (inst.arg & 1)
    op = STACK_OPS.get(inst.opname)
    if op is not None:
        return op.inputs(inst)
    return 1  # conditional jump: the condition


def _with_levels(code: types.CodeType, offset: int) -> int | None:
    """How many `with` blocks enclose the instruction at `offset`, when every exception
    handler around it is a `with` cleanup; None when a `try` handler encloses it."""
    insts = bytecode.decode(code)
    index = {id(i): k for k, i in enumerate(insts)}
    inst = inst_at(insts, offset)
    h = inst.exn
    levels = 0
    while h is not None:
        k = index[id(h.target)]
        if not (insts[k].opname == "PUSH_EXC_INFO" and k + 1 < len(insts)
                and insts[k + 1].opname == "WITH_EXCEPT_START"):
            return None
        levels += 1
        cleanup = h.target.exn  # the handler of the with-cleanup code: COPY 3; POP_EXCEPT; RERAISE
        h = cleanup.target.exn if cleanup is not None else None
    return levels


def _rebuild_value(tx, v, exc: Unsupported):
    """A tracker the entry can reconstruct standing for live value `v` (grad-mode exits and
    tensor methods become reconstructible stand-ins)."""
    from ferrodyn.variables.constant import ConstantVariable
    from ferrodyn.variables.ctx_managers import GradModeVariable
    from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
    from ferrodyn.variables.tensor import TensorMethodVariable

    if isinstance(v, BoundMethodVariable) and isinstance(v.func, MethodOf):
        if v.func.name == "__exit__" and isinstance(v.obj, GradModeVariable):
            return ConstantVariable(value=GradModeRestore(bool(v.obj.state.prev)))
        _refuse(exc, f"a live {v.describe()} (only grad-mode `with` blocks are re-entered)")
    if isinstance(v, BoundMethodVariable):  # obj.method of a user function: MethodType again
        func, obj = v.func, v.obj
        return _Rebuilt(lambda tx2: OutCall(types.MethodType, (tx2.realize(func).reconstruct(tx2),
                                                               tx2.realize(obj).reconstruct(tx2))))
    if isinstance(v, TensorMethodVariable):
        tensor, name = v.tensor, v.name
        return _Rebuilt(lambda tx2: OutCall(getattr, (tx2.realize(tensor).reconstruct(tx2),
                                                      OutConst(name))))
    return v


class _Rebuilt:
    """A value rebuilt by `make(tx) -> Out` (stands in for a tracker in `_reconstruct`)."""

    def __init__(self, make):
        self.make = make


def _mutable_identities(v, seen: dict, lists: set, exc: Unsupported) -> None:
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.lists import IteratorVariable, ListVariable, TupleVariable

    if isinstance(v, TupleVariable):
        for item in v.items:
            _mutable_identities(item, seen, lists, exc)
        return
    state = getattr(v, "state", None)
    existing = getattr(state, "mutation_type", None) is MutationType.EXISTING
    if state is None or (getattr(v, "source", None) is not None and existing):
        return
    key = id(state)
    if key in seen:
        if isinstance(v, _SHARED_REBUILD):
            return  # rebuilt once (SideEffects.shared), referenced at each place
        _refuse(exc, f"{v.describe()} is reachable twice from the live values")
    seen[key] = v
    if isinstance(v, ListVariable):
        lists.add(id(state.items))
        for item in state.items:
            _mutable_identities(item, seen, lists, exc)
    elif isinstance(v, DictVariable):
        for item in state.items.values():
            _mutable_identities(item, seen, lists, exc)
    elif isinstance(v, IteratorVariable):
        for item in state.items[state.index:]:
            _mutable_identities(item, seen, lists, exc)
        r = state.rebuild() if state.rebuild is not None else None
        if r is not None:  # a lazy one: the iterators it pulls from, its function or dict
            walk = r.parts + (r.args if r.kind != "reversed" else tuple(r.args[0].state.items))
            for part in walk:
                _mutable_identities(part, seen, lists, exc)


def _shared_rebuild_types() -> tuple[type, ...]:
    """Trackers of new objects whose `reconstruct` goes through `SideEffects.shared`: one
    object per entry call however often it is reached, so they may be live in two places."""
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.lists import ListVariable
    from ferrodyn.variables.sets import SetVariable
    return (ListVariable, DictVariable, SetVariable)


_SHARED_REBUILD: tuple[type, ...] = ()


def _check_iterator(v, lists: set, exc: Unsupported) -> None:
    """An iterator live across the break is rebuilt as a real iterator standing where the
    traced one stands (resume/loops.py: snapshots and loop rests as their remaining items,
    lazy ones from their parts, iterators over live lists and dicts as CPython's own at their
    position); refused where that is not exact (`loops.iterator_refusal`)."""
    why = iterator_refusal(v, lists)
    if why is not None:
        _refuse(exc, why)


def _reconstruct(tx, v, on_stack: bool, lists: set = frozenset()) -> Out:
    """Out spec of live value `v`. An iterator on the stack (a `for` loop's) is passed as a
    LoopRest of its remaining items when taking them is pure, turned back into an iterator
    by the resume prologue (so the resume frame traces it like any tuple), else as the real
    iterator; elsewhere it is rebuilt as a real iterator (`loops.rebuild_iterator`)."""
    from ferrodyn.variables.lists import IteratorVariable
    if isinstance(v, _Rebuilt):
        return v.make(tx)
    if isinstance(v, IteratorVariable):
        return rebuild_iterator(tx, v, on_stack, lists)
    return tx.realize(v).reconstruct(tx)


@dataclass
class OuterFrame:
    """A frame that inlined the call the break happened in (nested graph breaks): it
    continues, in its own resume function, after its call at `offset`, with the inner
    frames' result pushed on `stack`."""
    code: types.CodeType
    offset: int
    f_globals: dict
    stack: tuple[Out | None, ...]
    iters: tuple[bool, ...]
    locals: tuple[Out | None, ...]


class _Level:
    """The live state of one frame at the break, before reconstruction."""

    def __init__(self, tx, exc: Unsupported, innermost: bool):
        from ferrodyn.variables.functions import BoundMethodVariable, UserFunctionVariable
        self.tx = tx
        self.code, shift = origin(tx.code)
        inst = tx.instructions[tx.ip] if innermost else tx.current
        self.inst = inst
        self.offset = inst.offset - shift
        if self.offset < 0:  # in a resume prologue: only its call of the inner continuation
            self.offset = prologue_call(tx.code)
            if self.offset is None or inst.opname != "CALL_FUNCTION_EX":
                _refuse(exc, f"a break in the prologue of {tx.code.co_name}")
        if self.code.co_cellvars:
            _refuse(exc, f"{self.code.co_name} has cell variables (captured by an inner function)")
        if self.code.co_freevars:
            # the root's resume function is made per call with the frame's own cells; an
            # inner level's is handed over as an argument, so it must be one object
            if tx.parent is not None:
                _refuse(exc, f"{self.code.co_name} is an inlined closure")
            if len(self.code.co_varnames) + len(tx.stack) + 2 + len(self.code.co_freevars) > 255:
                _refuse(exc, f"{self.code.co_name} has too many locals for its closure's slots")
        if not innermost:
            # the call that inlined the next level must be a plain call of that function, so
            # that its result is exactly what the inner frames return
            callee = _callee(tx.stop_call_inputs or [], inst)
            callee = tx.realize(callee) if callee is not None else None
            if isinstance(callee, BoundMethodVariable):
                callee = tx.realize(callee.func)
            plain = inst.opname in ("CALL", "CALL_KW") or (
                inst.opname == "CALL_FUNCTION_EX" and inst.offset < shift)  # a prologue's
            if not (plain and isinstance(callee, UserFunctionVariable)):
                _refuse(exc, f"{inst.opname} of {getattr(callee, 'describe', lambda: '?')()} "
                             "inlines more than one plain call")
        levels = _with_levels(self.code, self.offset)
        if levels is None and not innermost:
            _refuse(exc, f"the call in {self.code.co_name} is inside a try block")
        self.stack = []
        self.exits = []
        for v in tx.stack:
            r = _rebuild_value(tx, tx.realize(v), exc)
            if _is_grad_exit(r):
                self.exits.append(r.value.prev)
            self.stack.append(r)
        if not innermost and len(self.exits) != levels:
            _refuse(exc, "a `with` block other than a grad-mode one encloses the break")
        # The breaking frame's innermost exception handler (a `try`, or a `with` block's
        # cleanup: user context managers' `__exit__` are live values like any other): an
        # exception from the instruction run at the break continues there (`raise_at`).
        self.handler = None
        if innermost:
            h = inst_at(bytecode.decode(self.code), self.offset).exn
            if h is not None:
                if h.depth > len(tx.stack) - n_inputs(inst):
                    _refuse(exc, "an exception handler deeper than the stack below the break")
                self.handler = (h.target.offset, h.depth, h.lasti)
        self.locals = [tx.locals.get(n) for n in self.code.co_varnames]


# original code -> offsets of the breaks already logged there (the graph_breaks channel logs
# each break once); cleared by ferrodyn.reset()
_LOGGED: "weakref.WeakKeyDictionary[types.CodeType, set[int]]" = weakref.WeakKeyDictionary()


def reset_state() -> None:
    _LOGGED.clear()


def _log_break(levels: list, exc: Unsupported) -> None:
    """The `graph_breaks` log record of a break that resumes: its reason and the user's stack
    (each level's file and line, innermost last), once per (code, instruction)."""
    from ferrodyn.logs import graph_breaks_log
    if not graph_breaks_log.isEnabledFor(logging.DEBUG):
        return
    inner = levels[-1]
    seen = _LOGGED.setdefault(inner.code, set())
    if inner.offset in seen:
        return
    seen.add(inner.offset)
    stack = "\n".join(f'  File "{lv.code.co_filename}", line {lv.inst.lineno}, in {lv.code.co_name}'
                      for lv in levels)
    graph_breaks_log.debug("Graph break in user code at %s:%s\nReason: %s\nUser code traceback:\n%s",
                           inner.code.co_filename, inner.inst.lineno, exc.construct
                           if isinstance(exc, Unsupported) else exc, stack)


def _is_grad_exit(v) -> bool:
    """Whether rebuilt value `v` stands for a grad-mode `with` block's `__exit__`."""
    return isinstance(getattr(v, "value", None), GradModeRestore)


def _callee(inputs, inst):
    from ferrodyn.variables.base import NullVariable
    if len(inputs) < 2:
        return None
    first, second = inputs[0], inputs[1]
    return second if isinstance(first, NullVariable) else first


def _kind(opname: str) -> str:
    return "call" if opname in _CALLS else "op" if opname in STACK_OPS else "jump"


def _noop_calls() -> frozenset:
    """Break markers whose call does nothing: the entry takes None as their result instead of
    calling them (identified by identity; their loads are guarded like any callee's)."""
    from ferrodyn.exc import graph_break
    return frozenset({graph_break, getattr(torch._dynamo, "graph_break", graph_break)})


def _graph_sets_grad(gm) -> bool:
    """Whether the captured graph switches grad mode itself (then the entry always sets the
    mode of the break)."""
    for n in getattr(getattr(gm, "graph", None), "nodes", ()):
        if n.op in ("call_function", "call_method") and "grad" in getattr(n.target, "__name__", str(n.target)):
            return True
    return False


def capture_break(tx, exc: Unsupported, autocast_at_entry: bool,
                  grad_at_entry: bool | None = None) -> TraceResult:
    """The TraceResult of a frame that breaks at `tx.instructions[tx.ip]` (tx stopped just
    before it; tx's parents, if any, are inside the calls that inlined it). Re-raises `exc`
    when the break cannot be resumed exactly."""
    from ferrodyn.variables.base import NullVariable
    from ferrodyn.variables.lists import IteratorVariable, TupleVariable

    inst = tx.instructions[tx.ip]
    if not breakable(inst.opname):
        _refuse(exc, f"breaks at {inst.opname} do not resume")
    if tx.kw_names and _VERSION >= (3, 13):
        _refuse(exc, "pending keyword names")
    n_in = n_inputs(inst)
    if len(tx.stack) < n_in:
        _refuse(exc, "the stack is shorter than the instruction's inputs")
    if torch.is_autocast_enabled() != autocast_at_entry:
        _refuse(exc, "autocast state changed before the break")
    chain = []
    t = tx
    while t is not None:
        chain.insert(0, t)
        t = t.parent
    levels = [_Level(t, exc, t is tx) for t in chain]
    if any(lv.exits for lv in levels[:-1]):
        _refuse(exc, "a `with` block encloses the call of an inlined function that breaks")
    inner = levels[-1]
    global _SHARED_REBUILD
    _SHARED_REBUILD = _SHARED_REBUILD or _shared_rebuild_types()
    seen: dict = {}
    lists: set = set()
    for lv in levels:
        for v in [*lv.stack, *lv.locals]:
            if v is not None and not isinstance(v, (_Rebuilt, NullVariable)):
                _mutable_identities(v, seen, lists, exc)
    for v in seen.values():
        if isinstance(v, IteratorVariable):
            _check_iterator(v, lists, exc)

    # One build_result over every live value, so graph outputs are shared and deduplicated.
    live = []
    for lv in levels:
        live += [(v, True) for v in lv.stack if not isinstance(v, NullVariable)]
        live += [(v, False) for v in lv.locals if v is not None]
    class _Live(TupleVariable):
        def reconstruct(self, tx2):
            return OutTuple(tuple(_reconstruct(tx2, v, on_stack, lists) for v, on_stack in live))

    # The side effects recorded so far are replayed after the graph call, before the breaking
    # instruction runs; the replay reads every live value first (it is its `before`), so a
    # live value is what it was at the break even when an effect changes where it came from.
    try:
        result = tx.output.build_result(chain[0], _Live(items=()))
    except Unsupported as e:
        _refuse(exc, f"cannot rebuild a live value: {e.construct}")
    if isinstance(result.output, OutShared):  # materialised once, before the effects
        outs_box = [OutCall(operator.getitem, (result.output, OutConst(i)))
                    for i in range(len(live))]
    else:
        outs_box = list(result.output.items)
    outs = iter(outs_box)
    frames = []
    for lv in levels:
        stack_outs = tuple(None if isinstance(v, NullVariable) else next(outs) for v in lv.stack)
        iters = tuple(isinstance(v, IteratorVariable) for v in lv.stack)
        local_outs = tuple(None if v is None else next(outs) for v in lv.locals)
        frames.append(OuterFrame(lv.code, lv.offset, lv.tx.f_globals, stack_outs, iters, local_outs))
    f = frames[-1]
    if any(f.iters[len(f.stack) - n_in:]):
        _refuse(exc, "an iterator among the breaking instruction's inputs")
    _log_break(levels, exc)
    noop = False
    if inst.opname in _CALLS:
        callee = _callee(tx.stack[len(tx.stack) - n_in:], inst)
        try:
            noop = callee is not None and getattr(tx.realize(callee), "fn", None) in _noop_calls()
        except TypeError:  # an unhashable callee
            noop = False
    grad = torch.is_grad_enabled()
    set_grad = grad != grad_at_entry or _graph_sets_grad(result.graph)
    result.output = OutCall(tuple, (OutList(tuple(outs_box)),))  # for the frontend: which outputs are used
    result.graph_break = GraphBreak(
        code=f.code, kind=_kind(inst.opname), opname=inst.opname,
        arg=inst.arg or 0, offset=f.offset, stack=f.stack, iters=f.iters, n_inputs=n_in,
        kw_names=tuple(tx.kw_names), locals=f.locals, grad_mode=grad, set_grad=set_grad, noop=noop,
        grad_on_error=inner.exits[0] if inner.exits else None, reason=exc, lineno=inst.lineno,
        f_globals=f.f_globals, outer=tuple(frames[:-1]), handler=inner.handler)
    return result



"""Graph breaks that resume: what happens at an instruction the converter cannot capture.

Owns three things:
- `capture_break(tx, exc)`: at the breaking instruction (the translator stopped just before
  it; when it is inside inlined calls, every enclosing translator is stopped inside its call),
  decide whether the state of every level can be rebuilt exactly, and if so turn it into a
  `TraceResult` whose `graph_break` (a `GraphBreak`, with an `OuterFrame` per enclosing
  level) says how the entry continues: the live stack (NULLs included) and locals as `Out`
  specs, the grad mode at the break, the instruction to run eagerly. It refuses (re-raises
  `exc`: the caller then tries a break at the root frame's call, else the frame runs eagerly
  as before) when it is not sure: an enclosing level's call inside a `try` or any `with`
  (the breaking level's `try`/`with` blocks are fine: an exception from the instruction run
  at the break continues in a resume function starting at the frame's own handler), a live
  autocast `with`, autocast changed, cell variables, an inlined closure, a new iterator
  reachable twice (new lists, dicts and sets live in two places are rebuilt once and
  referenced twice), a live value it cannot rebuild, an enclosing call that is not a plain
  call of a user function. Each resumed break is logged once on the `graph_breaks` channel.
- `resume_code(code, offset, nulls, unbound)`: the resume function's code, built with
  `ferrodyn.bytecode` from the *original* code: a prologue takes every local of the original
  (in co_varnames order) then the non-NULL stack values as positional arguments, deletes the
  locals that were unbound, pushes the stack back (PUSH_NULL for NULLs) and jumps to
  `offset`. Cached per (code, offset, stack shape, unbound locals), so recompiles reuse it.
  Resume functions are ordinary frames for the hook: they get their own cache entries.
- `emit_break(emitter, brk)`: the entry's instructions after the graph call: set the grad
  mode of the break, push the resume function, the stack, run the instruction (a call, or the
  conditional jump choosing between two resume functions), store the stack, push the locals,
  call the resume function. For nested breaks the innermost resume function is not called
  there: the root's resume function is, with the next level's resume function and argument
  tuple as two more arguments (and so on inwards); its prologue calls them, so tracing it
  inlines every level and what follows the break is one graph (torch's nested graph breaks).

Does not own tracing (symbolic/), the graph (output_graph.py) or the entry's graph call
(codegen.py).
"""

from __future__ import annotations

import dataclasses
import inspect
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
from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import ItemSource
from ferrodyn.side_effects import MutationType
from ferrodyn.trace_result import (
    Out, OutCall, OutConst, OutList, OutShared, OutSource, OutTuple, TraceResult,
)
from ferrodyn.variables.base import LazyVariable, VariableTracker

_VERSION = sys.version_info[:2]
_CALLS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX"})
_JUMPS = frozenset(f"POP_JUMP_{d}IF_{c}" for d in ("", "FORWARD_", "BACKWARD_") for c in ("TRUE", "FALSE"))


@dataclass
class GraphBreak:
    """How an entry continues after its graph: see the module docstring."""
    code: types.CodeType
    kind: str                          # "call" or "jump"
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
    return opname in _CALLS or opname in _JUMPS


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
    return 1  # conditional jump: the condition


def _with_levels(code: types.CodeType, offset: int) -> int | None:
    """How many `with` blocks enclose the instruction at `offset`, when every exception
    handler around it is a `with` cleanup; None when a `try` handler encloses it."""
    insts = bytecode.decode(code)
    index = {id(i): k for k, i in enumerate(insts)}
    inst = _inst_at(insts, offset)
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


def _inst_at(insts, offset: int):
    """The assembler instruction whose code units contain byte `offset`."""
    best = None
    for i in insts:
        if i.offset <= offset:
            best = i
        else:
            break
    return best


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


def _shared_rebuild_types() -> tuple[type, ...]:
    """Trackers of new objects whose `reconstruct` goes through `SideEffects.shared`: one
    object per entry call however often it is reached, so they may be live in two places."""
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.lists import ListVariable
    from ferrodyn.variables.sets import SetVariable
    return (ListVariable, DictVariable, SetVariable)


_SHARED_REBUILD: tuple[type, ...] = ()


def _check_iterator(v, lists: set, exc: Unsupported) -> None:
    """An iterator live across the break is rebuilt from its remaining items, a snapshot: only
    right when nothing can change what it would still produce. Refused: lazy iterators
    (enumerate, zip, reversed, map, filter, dict iterators keep their position in a step
    function, not in `items[index:]`), and list iterators over a list that is live itself or
    comes from outside the frame (a later mutation would show in CPython's iterator)."""
    st = v.state
    if st.exhausted:
        _refuse(exc, "an exhausted iterator is live across the break")
    if isinstance(st.step, _LoopRestStep):
        return  # the rest of an input: rebuilt from it (`_LoopRestStep.rest`)
    if st.step is not None:
        _refuse(exc, "a lazy iterator (enumerate, zip, reversed, map, filter, dict) is live "
                     "across the break")
    if id(st.items) in lists:
        _refuse(exc, "an iterator over a list that is itself live")
    owner = st.owner
    if owner is not None and owner.mutation_type is MutationType.EXISTING:
        _refuse(exc, "an iterator over a list from outside the frame is live across the break")


def _reconstruct(tx, v, on_stack: bool) -> Out:
    """Out spec of live value `v`. An iterator on the stack (a `for` loop's) is passed as a
    tuple of its remaining items, turned back into an iterator by the resume prologue (so
    the resume frame traces it like any tuple); elsewhere it is rebuilt as `iter([...])`."""
    from ferrodyn.variables.lists import IteratorVariable
    if isinstance(v, _Rebuilt):
        return v.make(tx)
    if isinstance(v, IteratorVariable):
        st = v.state
        if isinstance(st.step, _LoopRestStep):
            rest = st.step.rest()
            return rest if on_stack else OutCall(iter, (rest,))
        rest = tuple(tx.realize(i).reconstruct(tx) for i in st.items[st.index:])
        return OutCall(LoopRest, (OutTuple(rest),)) if on_stack else OutCall(iter, (OutList(rest),))
    return tx.realize(v).reconstruct(tx)


class LoopRest(tuple):
    """What a `for` loop's iterator still yields, handed to a resume function (its prologue
    iterates it: GET_ITER). A tuple to CPython; to the converter an input iterated lazily
    (`LoopRestVariable`): item k is guarded only when the loop reaches it, and its length only
    when the loop ends, so the resume function of a loop body is not specialised on how many
    iterations are left."""
    __slots__ = ()


class _LoopRestStep:
    """The step of an iterator over a LoopRest input: item `pos` through its Source (a type
    guard on it fails where the input is shorter), or, past the end, a length guard."""

    def __init__(self, source, value: tuple):
        self.source, self.value, self.pos = source, value, 0

    def __call__(self, tx):
        if self.pos >= len(self.value):
            tx.output.install_guard(self.source, GuardKind.LENGTH, self.pos)
            return None
        src = ItemSource(self.source, self.pos)
        v = self.value[self.pos]
        tx.output.install_guard(src, GuardKind.TYPE_MATCH, type(v))
        self.pos += 1
        return tx.realize(LazyVariable(source=src, value=v))

    def rest(self) -> Out:
        return OutCall(LoopRest, (OutCall(operator.getitem, (OutSource(self.source),
                                                             OutConst(slice(self.pos, None)))),))


def build_loop_rest(tx, value: LoopRest, source):
    """The builder's entry for a LoopRest input (variables/builder.py's type table)."""
    from ferrodyn.variables.lists import IterState, IteratorVariable
    tx.output.install_guard(source, GuardKind.TYPE_MATCH, LoopRest)
    return _LoopRestVariable(source=source, value=value,
                             it=IteratorVariable(state=IterState([], step=_LoopRestStep(source, value))))


@dataclass(frozen=True, eq=False)
class _LoopRestVariable(VariableTracker):
    value: Any = None
    it: Any = None

    def python_type(self):
        return LoopRest

    def describe(self):
        return "the rest of a loop's iterator"

    def iterator(self, tx):
        return self.it  # one iterator: the prologue's GET_ITER is its only use


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
            h = _inst_at(bytecode.decode(self.code), self.offset).exn
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
            return OutTuple(tuple(_reconstruct(tx2, v, on_stack) for v, on_stack in live))

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
        noop = getattr(tx.realize(callee), "fn", None) in _noop_calls() if callee is not None else False
    grad = torch.is_grad_enabled()
    set_grad = grad != grad_at_entry or _graph_sets_grad(result.graph)
    result.output = OutCall(tuple, (OutList(tuple(outs_box)),))  # for the frontend: which outputs are used
    result.graph_break = GraphBreak(
        code=f.code, kind="call" if inst.opname in _CALLS else "jump", opname=inst.opname,
        arg=inst.arg or 0, offset=f.offset, stack=f.stack, iters=f.iters, n_inputs=n_in,
        kw_names=tuple(tx.kw_names), locals=f.locals, grad_mode=grad, set_grad=set_grad, noop=noop,
        grad_on_error=inner.exits[0] if inner.exits else None, reason=exc, lineno=inst.lineno,
        f_globals=f.f_globals, outer=tuple(frames[:-1]), handler=inner.handler)
    return result


# ---------------------------------------------------------------------------------------------
# Resume functions
# ---------------------------------------------------------------------------------------------

_STACK = "__ferrodyn_stack"
_NESTED_FN = "__ferrodyn_nested_fn"
_NESTED_ARGS = "__ferrodyn_nested_args"
_RESUME_CODES: "weakref.WeakKeyDictionary[types.CodeType, dict]" = weakref.WeakKeyDictionary()
_ORIGIN: "weakref.WeakKeyDictionary[types.CodeType, tuple]" = weakref.WeakKeyDictionary()


# instructions whose argument indexes the cell/free slots (after the locals)
_DEREF_OPS = frozenset({"LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE", "MAKE_CELL",
                        "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF"})

NULL, VALUE, ITER = 0, 1, 2  # kinds of stack slots a resume prologue rebuilds


def resume_code(code: types.CodeType, offset: int, shape: tuple[int, ...],
                unbound: frozenset[int], nested_call: int | None = None,
                raise_at: int | None = None) -> types.CodeType:
    """The code of the resume function continuing `code` at the instruction at byte `offset`
    with a stack of `len(shape)` slots (NULL, VALUE, or ITER: an iterator over the tuple
    passed) and the locals `unbound` unset.

    `nested_call` (nested breaks): the byte offset of the call in `code` that inlined the
    frame which broke; `offset` is the instruction after it. The resume function then takes
    two more arguments, the inner frame's continuation and its argument tuple, and its
    prologue makes that call (`fn(*args)`, its result pushed on the rebuilt stack) before
    jumping to `offset`: tracing it inlines the inner continuation, so everything after the
    break, at every level, is one graph.

    `raise_at` (an exception from the instruction at that byte, run at the break): `offset`
    is its exception handler, the last stack value is the exception, and the prologue pushes
    below it, when the handler wants it, the raising instruction's index in the new code
    (`lasti`: what RERAISE uses to find the next handler, the same as in the original)."""
    per_code = _RESUME_CODES.setdefault(code, {})
    key = (offset, shape, unbound, nested_call, raise_at)
    hit = per_code.get(key)
    if hit is not None:
        return hit
    insts = bytecode.decode(code)
    target = next((i for i in insts if i.offset == offset), None)
    if target is None:
        raise ValueError(f"resume_code: no instruction at byte {offset} of {code.co_name}")
    b = bytecode.CodeBuilder(consts=code.co_consts, names=code.co_names,
                             varnames=code.co_varnames, positions=target.positions)
    n_stack = sum(1 for kind in shape if kind != NULL)
    stack_names = [f"{_STACK}{k}" for k in range(n_stack)]
    if nested_call is not None:
        stack_names += [_NESTED_FN, _NESTED_ARGS]
    assert not set(stack_names) & set(code.co_varnames), "resume_code of a resume code"
    for n in stack_names:
        b.local(n)
    added = len(b.varnames) - len(code.co_varnames)
    if code.co_freevars:
        # free variables live after the locals: the slots the added locals take shift them
        for i in insts:
            if i.opname in _DEREF_OPS:
                i.arg += added
    prologue = [b.inst("COPY_FREE_VARS", len(code.co_freevars))] if code.co_freevars else []
    prologue += [b.resume()]
    prologue += [b.inst("DELETE_FAST", i) for i in sorted(unbound)]
    lasti = None
    if raise_at is not None:
        h = _inst_at(insts, raise_at).exn
        assert h is not None and h.target is target, "raise_at: not the instruction's handler"
        if h.lasti:
            lasti = b.inst("LOAD_CONST", b.const(_LastiPlaceholder))
    k = 0
    for kind in shape:
        if kind == NULL:
            prologue.append(b.inst("PUSH_NULL"))
            continue
        if lasti is not None and k == n_stack - 1:
            prologue.append(lasti)
        prologue.append(b.load_fast(stack_names[k]))
        if kind == ITER:
            prologue.append(b.inst("GET_ITER"))
        k += 1
    if nested_call is not None:
        prologue += [*b.call_prefix(), b.load_fast(_NESTED_FN), *b.call_infix(),
                     b.load_fast(_NESTED_ARGS), b.inst("CALL_FUNCTION_EX", 0),
                     b.inst("DELETE_FAST", b.local(_NESTED_FN)),
                     b.inst("DELETE_FAST", b.local(_NESTED_ARGS))]
    prologue.append(b.inst("JUMP", target=target))
    line = target.lineno or code.co_firstlineno
    name = f"ferrodyn_resume_in_{code.co_name}_at_{line}"
    flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    new = bytecode.assemble(
        prologue + insts, code, co_argcount=len(b.varnames), co_posonlyargcount=0,
        co_kwonlyargcount=0, co_varnames=tuple(b.varnames), co_nlocals=len(b.varnames),
        co_consts=tuple(b.consts), co_names=tuple(b.names), co_flags=flags, co_name=name,
        co_qualname=f"{code.co_qualname}.<{name}>")
    after = bytecode.decode(new)[len(prologue):]
    shift = after[0].offset - insts[0].offset
    if any(a.offset - i.offset != shift for a, i in zip(after, insts)):
        raise ValueError(f"resume_code: {code.co_name}'s instructions moved (an argument grew)")
    if lasti is not None:
        consts = list(new.co_consts)
        consts[lasti.arg] = (raise_at + shift) // 2  # in code units, as CPython pushes it
        new = new.replace(co_consts=tuple(consts))
    _ORIGIN[new] = (code, shift, nested_call)
    per_code[key] = new
    return new


class _LastiPlaceholder:
    """Stands in co_consts for a resume prologue's lasti until the code is laid out."""


def origin(code: types.CodeType) -> tuple[types.CodeType, int]:
    """(original code, byte shift) of a resume code: its instructions after the prologue are
    the original's, byte for byte, `shift` bytes later. (code, 0) for any other code."""
    return _ORIGIN.get(code, (code, 0, None))[:2]


def prologue_call(code: types.CodeType) -> int | None:
    """For a nested resume code: the byte offset, in the original, of the call its prologue
    makes again (a frame stopped at that prologue call is, in the original, at that call)."""
    return _ORIGIN.get(code, (code, 0, None))[2]


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


def _next_offset(code: types.CodeType, offset: int) -> int:
    insts = bytecode.decode(code)
    for k, i in enumerate(insts):
        if i.offset <= offset < (insts[k + 1].offset if k + 1 < len(insts) else 1 << 62):
            return insts[k + 1].offset
    raise ValueError(f"no instruction after byte {offset} of {code.co_name}")


def _jump_target_offset(code: types.CodeType, offset: int) -> int:
    return _inst_at(bytecode.decode(code), offset).target.offset


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
        e.load_callable(fn)
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
        resume_fn = _resume_function(e, frame, _next_offset(frame.code, frame.offset), shape,
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
    if brk.kind == "call":
        fn = _resume_function(e, brk, _next_offset(brk.code, brk.offset), nulls + (VALUE,))
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
        if brk.opname == "CALL":
            e.call(brk.arg, brk.kw_names)
        else:
            e.emit(e.inst(brk.opname, brk.arg))
        if brk.handler is not None:
            _on_exception(e, brk, start)
        elif brk.grad_on_error is not None:
            _protect(e, start, brk.grad_on_error)
        _continue(e, brk, fn, n_lower + 1)
        return
    # a conditional jump on a value only known when the graph has run
    fn_next = _resume_function(e, brk, _next_offset(brk.code, brk.offset), nulls)
    fn_jump = _resume_function(e, brk, _jump_target_offset(brk.code, brk.offset), nulls)
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

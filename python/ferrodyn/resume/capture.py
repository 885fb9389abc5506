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


class AutocastReenter:
    """Stands for a live autocast `with` block's `__exit__` across a break (the graph before
    the break exits it, the entry runs the breaking instruction inside a real one): the
    resume prologue calls it, which enters the same autocast again (traced: the resume
    function's graph enters it) and gives that context's `__exit__`, called where the
    original's would be, with the original's semantics."""

    def __init__(self, args: tuple, make=None):
        self.args = args
        self.make = torch.amp.autocast if make is None else make  # state_ctx.py's kinds too

    def __call__(self):
        ctx = self.make(*self.args)
        ctx.__enter__()
        return ctx.__exit__

    def enter_real(self):
        """The entry's: the context the breaking instruction runs in (exited after it)."""
        ctx = self.make(*self.args)
        ctx.__enter__()
        return ctx

    @staticmethod
    def exit_real(ctx) -> None:
        ctx.__exit__(None, None, None)


_AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_state() -> tuple:
    """Torch's autocast state (enabled and dtype per device, the cache flag): a break resumes
    only where it is the entry's once the live autocast `with` blocks are exited."""
    return (tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                  for d in _AUTOCAST_DEVICES), torch.is_autocast_cache_enabled())


def _exit_live_autocasts(chain: list, n_in: int, exc: Unsupported) -> None:
    """The breaking level's live autocast `with` blocks are exited at the end of the graph
    (the entry and the resume function enter them again: AutocastReenter); one among the
    instruction's inputs, or around an enclosing level's call, is refused."""
    from ferrodyn.variables.ctx_managers import AutocastVariable
    from ferrodyn.variables.functions import BoundMethodVariable, MethodOf

    def live(t):
        return [k for k, v in enumerate(t.stack)
                if isinstance(v, BoundMethodVariable) and isinstance(v.func, MethodOf)
                and v.func.name == "__exit__"
                and (isinstance(v.obj, AutocastVariable) or hasattr(v.obj, "exit_at_break"))]
    if any(live(t) for t in chain[:-1]):
        _refuse(exc, "an autocast `with` block encloses the call of an inlined function that breaks")
    tx = chain[-1]
    ks = live(tx)
    if any(k >= len(tx.stack) - n_in for k in ks):
        _refuse(exc, "an autocast `__exit__` among the breaking instruction's inputs")
    for k in reversed(ks):
        obj = tx.stack[k].obj
        if not getattr(getattr(obj, "state", None), "entered", True):
            _refuse(exc, "an autocast `__exit__` of a context that is not entered")
        if hasattr(obj, "exit_at_break"):  # state_ctx.py's, profiler_ctx.py's contexts
            obj.exit_at_break(tx)
            continue
        st = obj.state
        tx.output.create_node("call_function", torch.amp._exit_autocast, (st.node,), {})
        st.real.__exit__(None, None, None)
        st.entered = False


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
    """How many `try` and `with` blocks enclose the instruction at `offset`; None when it sits
    in an exception handler's body (between PUSH_EXC_INFO and POP_EXCEPT: an `except` body,
    a `finally` or `with` cleanup run for an exception), where the exception being handled
    (`sys.exc_info()`, a bare `raise`, implicit chaining) is frame state that neither the
    entry nor a resume function rebuilds."""
    insts = bytecode.decode(code)
    index = {id(i): k for k, i in enumerate(insts)}
    h = inst_at(insts, offset).exn
    levels = 0
    while h is not None:
        k = index[id(h.target)]
        op, after = insts[k].opname, insts[k + 1].opname if k + 1 < len(insts) else None
        if op == "COPY" and after == "POP_EXCEPT":  # the cleanup around a handler's body
            return None
        if op == "PUSH_EXC_INFO":  # a `try` or `with` block; its handler's cleanup is next
            levels += 1
            cleanup = h.target.exn
            h = cleanup.target.exn if cleanup is not None else None
        else:  # other handler code (`except ... as e`, 3.12's inlined comprehensions)
            h = h.target.exn
    return levels


def _rebuild_value(tx, v, exc: Unsupported):
    """A tracker the entry can reconstruct standing for live value `v` (grad-mode exits and
    tensor methods become reconstructible stand-ins)."""
    from ferrodyn.variables.constant import ConstantVariable
    from ferrodyn.variables.ctx_managers import AutocastVariable, GradModeVariable
    from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
    from ferrodyn.variables.tensor import TensorMethodVariable
    global _CONTAINERS
    _CONTAINERS = _CONTAINERS or _containers()

    if isinstance(v, BoundMethodVariable) and isinstance(v.func, MethodOf):
        if v.func.name == "__exit__" and isinstance(v.obj, GradModeVariable):
            return ConstantVariable(value=GradModeRestore(bool(v.obj.state.prev)))
        if v.func.name == "__exit__" and isinstance(v.obj, AutocastVariable):
            return ConstantVariable(value=AutocastReenter(tuple(v.obj.args)))
        if v.func.name == "__exit__" and hasattr(v.obj, "reenter"):  # state_ctx.py's kinds
            r = v.obj.reenter()
            if r is None:
                _refuse(exc, f"a live {v.obj.describe()} that cannot be entered again")
            return ConstantVariable(value=r)
        from ferrodyn.variables.nn_module import NNModuleVariable
        if isinstance(v.obj, NNModuleVariable):  # `m.float` (nn_module's tree methods)
            obj, name = v.obj, v.func.name
            return _Rebuilt(lambda tx2: OutCall(getattr, (tx2.realize(obj).reconstruct(tx2),
                                                          OutConst(name))))
        if isinstance(v.obj, _CONTAINERS) and not v.func.name.startswith("__"):
            obj, name = v.obj, v.func.name  # `xs.append` pushed before a breaking call
            return _Rebuilt(lambda tx2: OutCall(getattr, (obj.reconstruct(tx2), OutConst(name))),
                            parts=(obj,))
        _refuse(exc, f"a live {v.describe()} (only grad-mode and autocast `with` blocks are "
                     "re-entered)")
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
    """A value rebuilt by `make(tx) -> Out` (stands in for a tracker in `_reconstruct`);
    `parts`: the mutable trackers it holds (live too: walked by `_mutable_identities`)."""

    def __init__(self, make, parts: tuple = ()):
        self.make, self.parts = make, parts


def _containers() -> tuple[type, ...]:
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.lists import ListVariable
    from ferrodyn.variables.sets import SetVariable
    return (ListVariable, DictVariable, SetVariable)


def _mutable_identities(v, seen: dict, lists: set, exc: Unsupported) -> None:
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.lists import IteratorVariable, ListVariable, TupleVariable
    from ferrodyn.variables.user_objects import NewObjectVariable

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
    elif isinstance(v, NewObjectVariable):  # a new object: what its attributes hold is live
        for item in state.attrs.values():
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
    from ferrodyn.variables.user_objects import NewObjectVariable
    return (ListVariable, DictVariable, SetVariable, NewObjectVariable)


_SHARED_REBUILD: tuple[type, ...] = ()
_CONTAINERS: tuple[type, ...] = ()


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
    handler: tuple | None = None       # (target, depth, lasti) of the handler around its call


class _Level:
    """The live state of one frame at the break, before reconstruction."""

    def __init__(self, tx, exc: Unsupported, innermost: bool):
        from ferrodyn.variables.functions import (BoundMethodVariable, NestedFunctionVariable,
                                                  UserFunctionVariable)
        self.tx = tx
        self.code, shift = origin(tx.code)
        inst = tx.instructions[tx.ip] if innermost else tx.current
        self.inst = inst
        self.offset = inst.offset - shift
        if self.offset < 0:  # in a resume prologue: only its call of the inner continuation
            self.offset = prologue_call(tx.code)
            if self.offset is None or inst.opname != "CALL_FUNCTION_EX":
                _refuse(exc, f"a break in the prologue of {tx.code.co_name}")
        # Cell and free variables: the resume function takes the cell objects themselves as
        # arguments (after the locals), so functions made before the break and the resume
        # function share them (CellVariable.reconstruct: a new cell is made once per call).
        self.cells = []
        for name in self.code.co_cellvars + self.code.co_freevars:
            cell = tx.cells.get(name)
            if cell is None or name in tx.locals:  # a comprehension's value in a cell's slot
                _refuse(exc, f"the cell slot {name!r} of {self.code.co_name} holds no cell")
            self.cells.append(cell)
        n_cells = len(self.cells)
        if n_cells and len(self.code.co_varnames) + 2 * n_cells + len(tx.stack) + 2 > 255:
            _refuse(exc, f"{self.code.co_name} has too many locals for its cells' slots")
        if not innermost:
            # the call that inlined the next level must be a plain call of that function, so
            # that its result is exactly what the inner frames return
            callee = _callee(tx.stop_call_inputs or [], inst)
            callee = tx.realize(callee) if callee is not None else None
            if isinstance(callee, BoundMethodVariable):
                callee = tx.realize(callee.func)
            plain = inst.opname in ("CALL", "CALL_KW") or (
                inst.opname == "CALL_FUNCTION_EX" and inst.offset < shift)  # a prologue's
            if not (plain and isinstance(callee, (UserFunctionVariable, NestedFunctionVariable))):
                _refuse(exc, f"{inst.opname} of {getattr(callee, 'describe', lambda: '?')()} "
                             "inlines more than one plain call")
        # Every level may sit in `try` and `with` blocks (each `__exit__` is a live value:
        # grad-mode ones rebuilt, user ones as bound methods; an enclosing level's resume
        # prologue makes its call under the handler around it), not in a handler's body.
        if _with_levels(self.code, self.offset) is None:
            _refuse(exc, f"{self.code.co_name} is inside an exception handler's body "
                         "(the exception being handled is not rebuilt)")
        self.stack = []
        self.exits = []
        for v in tx.stack:
            r = _rebuild_value(tx, tx.realize(v), exc)
            if _is_grad_exit(r):
                self.exits.append(r.value.prev)
            self.stack.append(r)
        # The frame's innermost exception handler (a `try`, or a `with` block's cleanup: user
        # context managers' `__exit__` are live values like any other): an exception from the
        # instruction run at the break continues there (`raise_at`) when no inner level has
        # one; one from a later inner continuation reaches it through the resume prologue's
        # call (`resume_code`), as in CPython.
        self.handler = None
        h = inst_at(bytecode.decode(self.code), self.offset).exn
        if h is not None:
            if h.depth > len(tx.stack) - (n_inputs(inst) if innermost else 0):
                _refuse(exc, "an exception handler deeper than the stack below the break")
            self.handler = (h.target.offset, h.depth, h.lasti)
        self.locals = [tx.locals.get(n) for n in self.code.co_varnames]
        self.locals += [_Rebuilt(lambda tx2, c=c: c.reconstruct(tx2)) for c in self.cells]


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


def _cell_contents(levels: list) -> list:
    """The contents of the new cells the entry rebuilds (each once): the levels' own cells and
    those of functions made in the frame that are live (their defaults too)."""
    from ferrodyn.variables.functions import CellVariable, NestedFunctionVariable
    from ferrodyn.variables.lists import TupleVariable
    out, seen = [], set()
    todo = [c for lv in levels for c in lv.cells]
    todo += [v for lv in levels for v in [*lv.stack, *lv.locals]]
    while todo:
        v = todo.pop()
        if isinstance(v, TupleVariable):
            todo += v.items
        elif isinstance(v, NestedFunctionVariable) and id(v) not in seen:
            seen.add(id(v))
            todo += [*v.fclosure, *v.fdefaults, *v.fkwdefaults.values()]
        elif isinstance(v, CellVariable) and id(v.state) not in seen:
            seen.add(id(v.state))
            if v.state.mutation_type is None and v.state.content is not None:
                out.append(v.state.content)
                todo.append(v.state.content)
    return out


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


def _frame_readers() -> dict:
    """Builtins that read the frame calling them: run by the entry at a break, they would read
    the entry's frame. callee -> fewest positional arguments that make it frame-independent
    (None: never)."""
    import inspect
    return {locals: None, globals: None, sys._getframe: None, inspect.currentframe: None,
            inspect.stack: None, vars: 1, dir: 1, super: 1, eval: 3, exec: 3}


def _check_frame_reader(tx, callee, inst, exc: Unsupported) -> None:
    v = tx.realize(callee) if callee is not None else None
    fn = getattr(v, "fn", getattr(v, "value", None))  # a builtin's tracker, or an opaque one
    try:
        readers = _frame_readers()
        if fn not in readers:
            return
    except TypeError:  # an unhashable callee
        return
    need = readers[fn]
    n_pos = inst.arg - len(tx.kw_names) if inst.opname == "CALL" else -1
    if need is None or n_pos < need:
        _refuse(exc, f"{getattr(fn, '__name__', fn)}() reads the frame that calls it")


def _graph_sets_grad(gm) -> bool:
    """Whether the captured graph switches grad mode itself (then the entry always sets the
    mode of the break: the graph may leave another; its last switch, after its last op, is
    erased, the entry's setting standing for it: `OutputGraph.build_result`)."""
    for n in getattr(getattr(gm, "graph", None), "nodes", ()):
        if n.op in ("call_function", "call_method") and "grad" in getattr(n.target, "__name__", str(n.target)):
            return True
    return False


def capture_break(tx, exc: Unsupported, autocast_at_entry: tuple,
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
    chain = []
    t = tx
    while t is not None:
        chain.insert(0, t)
        t = t.parent
    _exit_live_autocasts(chain, n_in, exc)
    if autocast_state() != autocast_at_entry:
        _refuse(exc, "autocast state changed before the break")
    levels = [_Level(t, exc, t is tx) for t in chain]
    inner = levels[-1]
    global _SHARED_REBUILD
    _SHARED_REBUILD = _SHARED_REBUILD or _shared_rebuild_types()
    seen: dict = {}
    lists: set = set()
    for lv in levels:
        for v in [*lv.stack, *lv.locals]:
            for p in (v.parts if isinstance(v, _Rebuilt) else (v,)):
                if p is not None and not isinstance(p, NullVariable):
                    _mutable_identities(p, seen, lists, exc)
    for v in _cell_contents(levels):  # new cells are rebuilt with their contents
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
        result = tx.output.build_result(chain[0], _Live(items=()), entry_sets_grad=True)
    except Unsupported as e:
        if "reroute_path" in e.__dict__:  # break at the earlier call it names (trace_frame)
            exc.__dict__["reroute_path"] = e.__dict__["reroute_path"]
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
        frames.append(OuterFrame(lv.code, lv.offset, lv.tx.f_globals, stack_outs, iters, local_outs,
                                 handler=lv.handler))
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
        _check_frame_reader(tx, callee, inst, exc)
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



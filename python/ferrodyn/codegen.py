"""Generate the entry function of a cache entry from a TraceResult, as bytecode.

Owns the instructions of the entry (assembled by `ferrodyn.bytecode`): load the graph inputs
from the frame's argument slots, closure cells, globals and builtins (each `Source` kind
renders as load instructions through `SOURCE_LOADERS`), call the compiled graph with this
thread's frame callback fenced (a try/finally in the entry's exception table, so nothing
inside the compiled graph is traced), evaluate `TraceResult.side_effects` in order for their
effect, rebuild the return value from the `Out` spec (through `OUT_RENDERERS`), return it; or,
for a graph break, hand over to `resume.emit_break` (the live stack, the unsupported
instruction run eagerly, the resume function). Objects the entry needs (the graph, classes,
non-literal constants, the user's globals/builtins dicts) are globals of the entry function
under `__ferrodyn_*` names; literals are `LOAD_CONST`. The entry's code object carries the
original's file name, name, qualified name and first line, so tracebacks read like the user's
function. Does not trace, compile graphs or build guards.

The Rust hook calls the entry positionally: `entry(*argument_slots, *closure_cells)` (see
`_C.CacheEntry`), followed by the `exported` sources' values where the guard tree hands some
over.
"""

from __future__ import annotations

import builtins
import dis
import inspect
import io
from types import CodeType, FunctionType
from typing import Any, Callable, Sequence

from ferrodyn import _C
from ferrodyn.bytecode import CodeBuilder, ExnHandler, Inst, Positions, assemble
from ferrodyn.source import (AttrSource, BuiltinSource, ClosureSource, DictItemSource, DictOfSource,
                             DictValueSource, GlobalSource, ItemSource, LenSource, LocalSource,
                             SetItemSource, Source, TypeSource)
from ferrodyn.symbolic_shapes import TensorPropertySource
from ferrodyn.variables.numpy_graph import NumpyTensorSource, ndarray_as_tensor
from ferrodyn.trace_result import (Out, OutCall, OutCell, OutConst, OutDict, OutGraph, OutList,
                                   OutShared, OutSource, OutTuple, TraceResult)

_P = "__ferrodyn_"          # prefix of every name the generated code introduces
_OUT = _P + "out"
_GRAPH = _P + "graph"
_SEF = _P + "sef"
_PRIOR = _P + "prior"
_G = _P + "G"
_B = _P + "B"

_LITERALS = (type(None), bool, int, str, bytes)


def argument_slot_count(code: CodeType) -> int:
    """Number of argument slots a frame of `code` has (positional and keyword-only parameters,
    then `*args` and `**kwargs` where present): the length of `FrameView.args`."""
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS)
    n += bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return n


def _is_literal(v: Any) -> bool:
    if type(v) in _LITERALS:
        return True
    return type(v) is tuple and all(_is_literal(x) for x in v)


class EntryEmitter:
    """Instructions of one generated function under construction, and the globals it binds.

    `params`: its positional parameter names (locals 0..n-1). `local_names` / `cell_names`:
    which parameter holds argument slot i / closure cell j of the original frame."""

    def __init__(self, code: CodeType, params: list[str], local_names: dict[int, str],
                 cell_names: dict[int, str], f_globals: dict, f_builtins: dict,
                 export_names: dict[Source, str] | None = None):
        self.code = code
        self.positions = Positions(code.co_firstlineno, code.co_firstlineno, None, None)
        self.b = CodeBuilder(varnames=params, positions=self.positions)
        self.params = list(params)
        self.local_names = local_names
        self.cell_names = cell_names
        self.insts: list[Inst] = [self.b.resume()]
        self.globals: dict[str, Any] = {
            "__builtins__": builtins.__dict__,
            "__name__": f_globals.get("__name__", "__ferrodyn_entry__"),
            _G: f_globals,
            _B: f_builtins,
        }
        self.export_names = dict(export_names or {})  # source -> parameter handing it over
        self.shared: set[int] = set()  # OutShared keys already evaluated (stored in a local)
        self.tail: list[Inst] = []  # exception handlers, placed after the body
        self._bound: dict[int, str] = {}
        self._temps = 0

    # -- emission primitives --------------------------------------------------------------
    def emit(self, *insts: Inst) -> None:
        self.insts.extend(insts)

    def inst(self, opname: str, arg: int | None = None, **kw) -> Inst:
        return self.b.inst(opname, arg, **kw)

    def temp(self, what: str) -> str:
        """A fresh local name (never a parameter's)."""
        self._temps += 1
        name = f"{_P}{what}{self._temps}"
        self.b.local(name)
        return name

    def bind(self, value: Any, name: str | None = None) -> str:
        """A global of the entry holding `value` (one per object)."""
        if name is None:
            name = self._bound.get(id(value))
            if name is None:
                name = self._bound[id(value)] = f"{_P}k{len(self._bound)}"
        self.globals[name] = value
        return name

    def load_value(self, value: Any) -> None:
        if _is_literal(value):
            self.emit(self.b.load_const(value))
        else:
            self.emit(self.b.load_global(self.bind(value)))

    def load_callable(self, value: Any = None, *, name: str | None = None) -> None:
        """The callable of a call (with the NULL below or above it, as the version wants)."""
        self.emit(self.b.load_global(name or self.bind(value), push_null=True))

    def call(self, nargs: int, kwnames: tuple[str, ...] = ()) -> None:
        self.emit(*self.b.call(nargs, kwnames))

    def subscr(self) -> None:
        self.emit(self.inst("BINARY_SUBSCR"))

    # -- sources and outputs --------------------------------------------------------------
    def load_source(self, source: Source) -> None:
        param = self.export_names.get(source)
        if param is not None:
            self.emit(self.b.load_fast(param))
            return
        loader = SOURCE_LOADERS.get(type(source))
        if loader is None:
            raise TypeError(f"codegen: no bytecode rendering for source {source.name()} "
                            f"({type(source).__name__})")
        loader(self, source)

    def emit_out(self, out: Out) -> None:
        render = OUT_RENDERERS.get(type(out))
        if render is None:
            raise TypeError(f"codegen: unknown output spec {out!r}")
        render(self, out)

    # -- the graph call ---------------------------------------------------------------------
    def graph_call(self, graph_fn: Callable[..., Any], inputs: list[Source], fence: bool) -> None:
        """`__ferrodyn_out = graph(*inputs)`, fenced by `prior = sef(False)` ... `finally:
        sef(prior)` when `fence`. The handlers go at the end (see `finish`)."""
        self.bind(graph_fn, _GRAPH)
        if fence:
            self.bind(_C.set_eval_frame if hasattr(_C, "set_eval_frame") else (lambda cb: None), _SEF)
            self.load_callable(name=_SEF)
            self.emit(self.b.load_const(False))
            self.call(1)
            self.emit(self.b.store_fast(_PRIOR))
        start = len(self.insts)
        self.load_callable(name=_GRAPH)
        for src in inputs:
            self.load_source(src)
        self.call(len(inputs))
        self.emit(self.b.store_fast(_OUT))
        if not fence:
            return
        protected = self.insts[start:]
        restore = self._restore_callback()
        self.emit(*restore)
        # exceptional path: PUSH_EXC_INFO; sef(prior); RERAISE 0 / cleanup: COPY 3; POP_EXCEPT; RERAISE 1
        cleanup = [self.inst("COPY", 3), self.inst("POP_EXCEPT"), self.inst("RERAISE", 1)]
        handler = [self.inst("PUSH_EXC_INFO"), *self._restore_callback(), self.inst("RERAISE", 0)]
        on_error = ExnHandler(handler[0], 0, False)
        on_cleanup = ExnHandler(cleanup[0], 1, True)
        for i in protected:
            i.exn = on_error
        for i in handler:
            i.exn = on_cleanup
        self.tail += handler + cleanup

    def _restore_callback(self) -> list[Inst]:
        b = self.b
        return [b.load_global(_SEF, push_null=True), b.load_fast(_PRIOR), *b.call(1),
                b.inst("POP_TOP")]

    def side_effects(self, outs) -> None:
        for o in outs:
            self.emit_out(o)
            self.emit(self.inst("POP_TOP"))

    def ret(self) -> None:
        self.emit(self.inst("RETURN_VALUE"))

    # -- the function ---------------------------------------------------------------------
    def finish(self, fields: dict[str, Any] | None = None) -> FunctionType:
        insts = self.insts + self.tail
        code = self.code
        flags = inspect.CO_OPTIMIZED | inspect.CO_NEWLOCALS
        new = assemble(insts, code, co_argcount=len(self.params), co_posonlyargcount=0,
                       co_kwonlyargcount=0, co_freevars=(), co_cellvars=(),
                       co_consts=tuple(self.b.consts) or (None,),
                       co_names=tuple(self.b.names), co_varnames=tuple(self.b.varnames),
                       co_nlocals=len(self.b.varnames), co_flags=flags, **(fields or {}))
        fn = FunctionType(new, self.globals, code.co_name)
        fn.__qualname__ = code.co_qualname
        if hasattr(_C, "skip_code"):
            _C.skip_code(new)
        return fn


def listing(fn: FunctionType) -> str:
    """A readable listing of a generated function (for logs and `__ferrodyn_source__`)."""
    out = io.StringIO()
    dis.dis(fn.__code__, file=out)
    return out.getvalue()


# -- sources ---------------------------------------------------------------------------------

def _load_attr(attr: str):
    def load(e: EntryEmitter, s) -> None:
        e.load_source(s.base)
        e.emit(e.b.load_attr(attr if attr else s.attr))
    return load


def _load_dict_item(dict_name: str, key_field: str):
    def load(e: EntryEmitter, s) -> None:
        e.emit(e.b.load_global(dict_name))
        e.load_value(getattr(s, key_field))
        e.subscr()
    return load


def _load_item(e: EntryEmitter, s: ItemSource) -> None:
    e.load_source(s.base)
    e.load_value(s.key)
    e.subscr()


def _call_on_base(fn: Callable[[Any], Any]):
    def load(e: EntryEmitter, s) -> None:
        e.load_callable(fn)
        e.load_source(s.base)
        e.call(1)
    return load


def _load_closure(e: EntryEmitter, s: ClosureSource) -> None:
    e.emit(e.b.load_fast(e.cell_names[s.index]), e.b.load_attr("cell_contents"))


def set_item(s: Any, index: int) -> Any:
    """The `index`-th element of a set in iteration order (SetItemSource)."""
    for i, v in enumerate(s):
        if i == index:
            return v
    raise IndexError(index)


def _load_set_item(e: EntryEmitter, s: SetItemSource) -> None:
    e.load_callable(set_item)
    e.load_source(s.base)
    e.load_value(s.index)
    e.call(2)


def dict_value(d: dict, index: int) -> Any:
    """The `index`-th value of a dict in insertion order (DictValueSource)."""
    for i, v in enumerate(d.values()):
        if i == index:
            return v
    raise IndexError(index)


def _load_dict_value(e: EntryEmitter, s: DictValueSource) -> None:
    e.load_callable(dict_value)
    e.load_source(s.base)
    e.load_value(s.index)
    e.call(2)


def _load_dict_storage_item(e: EntryEmitter, s: DictItemSource) -> None:
    """`dict.__getitem__(base, key)` (past the subclass's overrides)."""
    e.load_callable(dict.__getitem__)
    e.load_source(s.base)
    e.load_value(s.key)
    e.call(2)


def tensor_property(t: Any, prop: str, idx: int) -> Any:
    """`t.size(idx)` / `t.stride(idx)`: a symbolic dim handed to the graph as an input."""
    return getattr(t, prop)(idx)


def _load_tensor_property(e: EntryEmitter, s: TensorPropertySource) -> None:
    e.load_callable(tensor_property)
    e.load_source(s.base)
    e.load_value(s.prop)
    e.load_value(s.idx)
    e.call(3)


SOURCE_LOADERS: dict[type, Callable[[EntryEmitter, Any], None]] = {
    LocalSource: lambda e, s: e.emit(e.b.load_fast(e.local_names[s.index])),
    GlobalSource: _load_dict_item(_G, "global_name"),
    BuiltinSource: _load_dict_item(_B, "builtin_name"),
    ClosureSource: _load_closure,
    AttrSource: _load_attr(""),
    DictOfSource: _load_attr("__dict__"),
    ItemSource: _load_item,
    TypeSource: _call_on_base(type),
    LenSource: _call_on_base(len),
    SetItemSource: _load_set_item,
    DictValueSource: _load_dict_value,
    DictItemSource: _load_dict_storage_item,
    TensorPropertySource: _load_tensor_property,
    NumpyTensorSource: _call_on_base(ndarray_as_tensor),
}


# -- outputs ---------------------------------------------------------------------------------

def _out_graph(e: EntryEmitter, o: OutGraph) -> None:
    e.emit(e.b.load_fast(_OUT), e.b.load_const(o.index))
    e.subscr()


def _out_seq(opname: str):
    def render(e: EntryEmitter, o) -> None:
        for item in o.items:
            e.emit_out(item)
        e.emit(e.inst(opname, len(o.items)))
    return render


def _out_dict(e: EntryEmitter, o: OutDict) -> None:
    if o.cls is dict:
        for k, v in zip(o.keys, o.values):
            e.load_value(k)
            e.emit_out(v)
        e.emit(e.inst("BUILD_MAP", len(o.keys)))
        return
    e.load_callable(o.cls)
    for k, v in zip(o.keys, o.values):
        e.load_value(k)
        e.emit_out(v)
        e.emit(e.inst("BUILD_TUPLE", 2))
    e.emit(e.inst("BUILD_LIST", len(o.keys)))
    e.call(1)


def _out_call(e: EntryEmitter, o: OutCall) -> None:
    e.load_callable(o.cls)
    for a in o.args:
        e.emit_out(a)
    e.call(len(o.args), tuple(o.kwnames))


def _out_shared(e: EntryEmitter, o) -> None:
    """OutShared(key, value): evaluated once per call (kept in a local), the same object at
    every later occurrence."""
    name = f"{_P}sh{o.key}"
    if o.key in e.shared:
        e.emit(e.b.load_fast(name))
        return
    e.shared.add(o.key)
    e.emit_out(o.value)
    e.emit(e.inst("COPY", 1), e.b.store_fast(name))


OUT_RENDERERS: dict[type, Callable[[EntryEmitter, Any], None]] = {
    OutGraph: _out_graph,
    OutConst: lambda e, o: e.load_value(o.value),
    OutSource: lambda e, o: e.load_source(o.source),
    OutTuple: _out_seq("BUILD_TUPLE"),
    OutList: _out_seq("BUILD_LIST"),
    OutDict: _out_dict,
    OutCall: _out_call,
    OutShared: _out_shared,
    OutCell: lambda e, o: e.emit(e.b.load_fast(e.cell_names[o.index])),  # the frame's cell j
}


# -- the entry ---------------------------------------------------------------------------------

def entry_emitter(code: CodeType, f_globals: dict, f_builtins: dict,
                  exported: Sequence[Source] = ()) -> EntryEmitter:
    """An emitter whose parameters are `code`'s argument slots, then its closure cells, then
    the `exported` sources' values (handed over by the guard tree)."""
    nslots = argument_slot_count(code)
    # the user's names (readable in tracebacks), except names in the generated namespace
    local_names = {i: n if not n.startswith(_P) else f"{_P}a{i}"
                   for i, n in enumerate(code.co_varnames[:nslots])}
    cell_names = {j: f"{_P}c{j}" for j in range(len(code.co_freevars))}
    export_names = {src: f"{_P}x{i}" for i, src in enumerate(exported)}
    params = [*local_names.values(), *cell_names.values(), *export_names.values()]
    return EntryEmitter(code, params, local_names, cell_names, f_globals, f_builtins,
                        export_names)


def generate_entry(code: CodeType, result: TraceResult, graph_fn: Callable[..., Any] | None,
                   f_globals: dict, f_builtins: dict, *, fence: bool = True,
                   resume: Any = None, exported: Sequence[Source] = ()) -> FunctionType:
    """The entry function for `code`: calls `graph_fn` (the backend's compiled graph; None when
    the return value needs no graph) on the inputs named by `result.graph_inputs`, evaluates
    `result.side_effects`, and returns the value described by `result.output` — or, when
    `result.graph_break` is set, continues as `resume.emit_break` describes (`resume`: the
    resume functions, from resume.py). Its code is marked SKIP so that the hook never
    intercepts the entry itself.

    `fence`: run `graph_fn` with this thread's callback set to False (cached entries only, no
    tracing), so that no Python frame inside a compiled graph is ever traced. The caller may
    drop it for graphs known to reach no user code (convert_frame.graph_is_closed).

    `exported`: sources whose values the caller passes after the closure cells, in this
    order (loaded from those parameters instead of being read again)."""
    e = entry_emitter(code, f_globals, f_builtins, exported)
    if graph_fn is not None:
        e.graph_call(graph_fn, list(result.graph_inputs), fence)
    e.side_effects(result.side_effects)
    brk = result.graph_break
    if brk is not None:
        from ferrodyn import resume as resume_mod
        resume_mod.emit_break(e, brk, resume)
    else:
        e.emit_out(result.output)
        e.ret()
    fn = e.finish()
    fn.__ferrodyn_source__ = listing(fn)  # type: ignore[attr-defined]
    return fn


def direct_call(code: CodeType, result: TraceResult, graph_fn: Callable[..., Any] | None,
                *, fence: bool, exported: Sequence[Source] = ()) -> tuple | None:
    """The plan of the entry's direct call (rust/cache/direct.rs), or None: when the entry
    `generate_entry` makes for the same arguments only computes `graph_fn(*inputs)[k]` (every
    input an argument slot of the frame or an exported value; no side effects, no graph break),
    a cache hit may call `graph_fn` itself instead of running the entry's frame. The entry
    function stays the reference (what runs whenever the direct call is not taken), so the two
    must agree: this mirrors `generate_entry`'s `graph_call` and `_out_graph`."""
    out = result.output
    if graph_fn is None or result.side_effects or result.graph_break is not None or \
            type(out) is not OutGraph:
        return None
    nslots = argument_slot_count(code)
    exported_at = {src: j for j, src in enumerate(exported)}
    args = []
    for src in result.graph_inputs:
        j = exported_at.get(src)
        if j is not None:
            args.append((True, j))
        elif type(src) is LocalSource and 0 <= src.index < nslots:
            args.append((False, src.index))
        else:
            return None
    return (graph_fn, tuple(args), out.index, fence)


# kept for code that renders sources as Python text (explain, logs)
__all__ = ["generate_entry", "direct_call", "argument_slot_count", "EntryEmitter", "entry_emitter",
           "SOURCE_LOADERS", "OUT_RENDERERS", "listing"]

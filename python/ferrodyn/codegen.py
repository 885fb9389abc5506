"""Generate the entry function of a cache entry from a TraceResult.

Owns the Python source of the entry: load the graph inputs from the frame's argument slots,
closure cells, globals and builtins (through `Source.to_python`), call the compiled graph with
this thread's frame callback fenced (so nothing inside the compiled graph is traced), rebuild
the return value from the `Out` spec, return it. The source is compiled with `compile()` under
the original code's file name and first line, named like the original, so tracebacks read like
the user's function. Does not trace, compile graphs or build guards.

The Rust hook calls the entry positionally: `entry(*argument_slots, *closure_cells)` (see
`_C.CacheEntry`).
"""

from __future__ import annotations

import builtins
import keyword
from types import CodeType, FunctionType
from typing import Any, Callable

from ferrodyn import _C
from ferrodyn.source import CodegenEnv
from ferrodyn.trace_result import (
    Out,
    OutCall,
    OutConst,
    OutDict,
    OutGraph,
    OutList,
    OutSource,
    OutTuple,
    TraceResult,
)

_P = "__ferrodyn_"          # prefix of every name the generated code introduces
_ENTRY = _P + "entry"
_OUT = _P + "out"
_GRAPH = _P + "graph"
_SEF = _P + "sef"
_PRIOR = _P + "prior"


def argument_slot_count(code: CodeType) -> int:
    """Number of argument slots a frame of `code` has (positional and keyword-only parameters,
    then `*args` and `**kwargs` where present): the length of `FrameView.args`."""
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & 0x04)  # CO_VARARGS
    n += bool(code.co_flags & 0x08)  # CO_VARKEYWORDS
    return n


def _param_name(name: str, fallback: str) -> str:
    ok = name.isidentifier() and not keyword.iskeyword(name) and not name.startswith(_P)
    return name if ok else fallback


class _Emitter:
    """Renders Out nodes to expressions, binding non-literal values as globals of the entry."""

    def __init__(self, env: CodegenEnv, bindings: dict[str, Any]):
        self.env = env
        self.bindings = bindings

    def bind(self, value: Any) -> str:
        name = f"{_P}k{len(self.bindings)}"
        self.bindings[name] = value
        return name

    def expr(self, out: Out) -> str:
        render = _RENDER.get(type(out))
        if render is None:
            raise TypeError(f"codegen: unknown output spec {out!r}")
        return render(self, out)

    def items(self, items) -> str:
        return ", ".join(self.expr(i) for i in items)


def _const(e: _Emitter, o: OutConst) -> str:
    v = o.value
    if v is None or v is True or v is False or type(v) in (int, str, bytes):
        return repr(v)
    return e.bind(v)


def _dict(e: _Emitter, o: OutDict) -> str:
    if o.cls is dict:
        return "{" + ", ".join(f"{e.bind(k)}: {e.expr(v)}" for k, v in zip(o.keys, o.values)) + "}"
    pairs = ", ".join(f"({e.bind(k)}, {e.expr(v)})" for k, v in zip(o.keys, o.values))
    return f"{e.bind(o.cls)}([{pairs}])"


def _call(e: _Emitter, o: OutCall) -> str:
    npos = len(o.args) - len(o.kwnames)
    parts = [e.expr(a) for a in o.args[:npos]]
    parts += [f"{k}={e.expr(a)}" for k, a in zip(o.kwnames, o.args[npos:])]
    return f"{e.bind(o.cls)}({', '.join(parts)})"


_RENDER: dict[type, Callable[[_Emitter, Any], str]] = {
    OutGraph: lambda e, o: f"{_OUT}[{o.index}]",
    OutConst: _const,
    OutSource: lambda e, o: o.source.to_python(e.env),
    OutTuple: lambda e, o: f"({e.items(o.items)}{',' if len(o.items) == 1 else ''})",
    OutList: lambda e, o: f"[{e.items(o.items)}]",
    OutDict: _dict,
    OutCall: _call,
}


def generate_entry(code: CodeType, result: TraceResult, graph_fn: Callable[..., Any] | None,
                   f_globals: dict, f_builtins: dict, *, fence: bool = True) -> FunctionType:
    """The entry function for `code`: calls `graph_fn` (the backend's compiled graph; None when
    the return value needs no graph) on the inputs named by `result.graph_inputs` and returns
    the value described by `result.output`. Its code is marked SKIP so that the hook never
    intercepts the entry itself.

    `fence`: run `graph_fn` with this thread's callback set to False (cached entries only, no
    tracing), so that no Python frame inside a compiled graph is ever traced. The caller may
    drop it for graphs known to reach no user code (convert_frame.graph_is_closed)."""
    nslots = argument_slot_count(code)
    params, local_names = [], {}
    for i, name in enumerate(code.co_varnames[:nslots]):
        local_names[i] = _param_name(name, f"{_P}a{i}")
        params.append(local_names[i])
    cell_names = {j: f"{_P}c{j}" for j in range(len(code.co_freevars))}
    params += cell_names.values()
    if len(set(params)) != len(params):  # defensive: never shadow one parameter by another
        local_names = {i: f"{_P}a{i}" for i in local_names}
        params = [*local_names.values(), *cell_names.values()]
    env = CodegenEnv(local_names, cell_names)

    bindings: dict[str, Any] = {}
    emit = _Emitter(env, bindings)
    body = []
    if graph_fn is not None:
        args = ", ".join(src.to_python(env) for src in result.graph_inputs)
        if fence:
            body.append(f"try: {_PRIOR} = {_SEF}(False); {_OUT} = {_GRAPH}({args})")
            body.append(f"finally: {_SEF}({_PRIOR})")
        else:
            body.append(f"{_OUT} = {_GRAPH}({args})")
    body += [emit.expr(effect) for effect in result.side_effects]  # for their effect only
    body.append(f"return {emit.expr(result.output)}")
    src = f"def {_ENTRY}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)

    g: dict[str, Any] = {
        "__builtins__": builtins.__dict__,
        "__name__": f_globals.get("__name__", "__ferrodyn_entry__"),
        env.globals_name: f_globals,
        env.builtins_name: f_builtins,
        _GRAPH: graph_fn,
        _SEF: _C.set_eval_frame if hasattr(_C, "set_eval_frame") else (lambda cb: None),
        **bindings,
        **env.bindings,
    }
    # Pad so that the `def` sits on the original first line: errors inside the graph point at
    # the first lines of the user's function.
    pad = "\n" * max(code.co_firstlineno - 1, 0)
    exec(compile(pad + src, code.co_filename, "exec"), g)
    fn = g[_ENTRY]
    fn.__code__ = fn.__code__.replace(co_name=code.co_name, co_qualname=code.co_qualname)
    fn.__name__ = code.co_name
    fn.__qualname__ = code.co_qualname
    fn.__ferrodyn_source__ = src  # type: ignore[attr-defined]
    if hasattr(_C, "skip_code"):
        _C.skip_code(fn.__code__)
    return fn

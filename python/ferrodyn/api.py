"""The public entry points: `compile`, `disable`, `reset`, `explain`.

Owns argument checking (with torch.compile's messages where they exist), the choice between a
function wrapper and an `OptimizedModule`, resetting every cache, and the `explain` report.
Does not own the compile pipeline (convert_frame.py), the per-call wrapper (eval_frame.py) or
the backend registry (backends/).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch

from ferrodyn import _C, config, convert_frame
from ferrodyn.backends import backend_name, bind_backend
from ferrodyn.eval_frame import disable, wrap_compiled

__all__ = ["compile", "disable", "reset", "explain", "ExplainOutput"]

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _check_args(backend, fullgraph, dynamic, mode, options) -> None:
    if not (isinstance(backend, str) or callable(backend)):
        raise TypeError(f"ferrodyn.compile: backend must be a str or a callable, got {type(backend).__name__}")
    if not isinstance(fullgraph, bool):
        raise TypeError(f"ferrodyn.compile: fullgraph must be a bool, got {type(fullgraph).__name__}")
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"ferrodyn.compile: dynamic must be None or a bool, got {type(dynamic).__name__}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"ferrodyn.compile: options must be a dict, got {type(options).__name__}")
    if mode not in _MODES:
        raise RuntimeError(f"Unrecognized mode={mode!r}, should be one of: {', '.join(m for m in _MODES if m)}")


def compile(model_or_fn: Callable[..., Any] | None = None, *, backend: str | Callable[..., Any] = "inductor",
            fullgraph: bool = False, dynamic: bool | None = None, options: dict | None = None,
            mode: str | None = None, disable: bool = False):
    """Capture `model_or_fn` into graphs and run them with `backend`, like `torch.compile`.

    `ferrodyn.compile(fn)`, `@ferrodyn.compile` and `@ferrodyn.compile(backend=...)` all work.
    An `nn.Module` gives an `OptimizedModule`; functions, methods and bound methods give a
    wrapper of the same signature. `fullgraph=True` raises `ferrodyn.Unsupported` for code that
    cannot be captured whole (otherwise such frames run eagerly). `dynamic`: None (automatic
    dynamic: a recompile caused by a changed size or int makes it symbolic), True (symbolic
    from the first compile), False (always specialised); `torch._dynamo.mark_dynamic` and
    `ferrodyn.mark_dynamic` & co. are honoured. `options`/`mode`: Inductor options, as for
    torch.compile.
    """
    _check_args(backend, fullgraph, dynamic, mode, options)
    if model_or_fn is None:
        return functools.partial(compile, backend=backend, fullgraph=fullgraph, dynamic=dynamic,
                                 options=options, mode=mode, disable=disable)
    if not callable(model_or_fn):
        raise TypeError(f"ferrodyn.compile expects a callable or an nn.Module, got {type(model_or_fn).__name__}")
    compiler = bind_backend(backend, mode=mode, options=options, dynamic=dynamic)
    if disable:
        return model_or_fn
    callback = convert_frame.FrameCallback(compiler, fullgraph=fullgraph, dynamic=dynamic)
    callback.backend_name = backend_name(backend)
    if isinstance(model_or_fn, torch.nn.Module):
        from ferrodyn.optimized_module import OptimizedModule

        return OptimizedModule(model_or_fn, callback, options)
    return wrap_compiled(model_or_fn, callback)


def reset() -> None:
    """Forget everything compiled: every cache entry, the SKIP/RUN_ONLY flags, the counters
    (Rust), and the frontend's memory of frames that ran eagerly."""
    if hasattr(_C, "reset"):
        _C.reset()
    convert_frame.reset_state()
    if hasattr(_C, "set_cache_size_limit"):
        _C.set_cache_size_limit(config.cache_size_limit)


# ---------------------------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------------------------

class ExplainOutput:
    """What `ferrodyn.explain(fn)(*args)` found.

    graphs: the captured fx GraphModules; graph_count; ops_per_graph / ops: the operations of
    each graph / of all; guards: readable guard expressions of every compiled entry;
    break_reasons: why frames ran eagerly (the Unsupported messages); graph_break_count;
    recompile_reasons: the failing guard of each entry when a frame was compiled again.
    """

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.ops_per_graph: list[list[Any]] = []
        self.guards: list[str] = []
        self.break_reasons: list[str] = []
        self.recompile_reasons: list[str] = []
        self.frames: list[str] = []

    # recorder protocol (convert_frame.recorders)
    def on_graph(self, record) -> None:
        brk = getattr(getattr(record, "result", None), "graph_break", None)
        if brk is not None:
            # where the frame breaks (its call or jump); the reason names the innermost line
            where = f"{brk.code.co_filename}:{brk.lineno}"
            self.break_reasons.append(f"{brk.code.co_qualname} ({where}): graph break: {brk.reason}")
            if not convert_frame.graph_ops(record.graph):
                return  # nothing captured before the break: no graph (as torch.compile)
        self.graphs.append(record.graph)
        self.ops_per_graph.append(convert_frame.graph_ops(record.graph))
        self.guards.extend(record.guards)
        self.recompile_reasons.extend(record.recompile_reasons)
        self.frames.append(record.code.co_qualname)

    def on_eager(self, record) -> None:
        code = record.code
        self.break_reasons.append(f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno}): {record.reason}")

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        return len(self.break_reasons)

    @property
    def ops(self) -> list[Any]:
        return [op for ops in self.ops_per_graph for op in ops]

    @property
    def op_count(self) -> int:
        return len(self.ops)

    def __str__(self) -> str:
        def opname(op: Any) -> str:
            if isinstance(op, str):
                return op
            name, mod = getattr(op, "__name__", None), getattr(op, "__module__", None)
            if name is None:
                return str(op)
            return name if mod in (None, "_operator", "operator", "builtins") else f"{mod}.{name}"

        lines = [f"Graph count: {self.graph_count}",
                 f"Graph break count: {self.graph_break_count}",
                 f"Op count: {self.op_count}"]
        for i, (frame, ops) in enumerate(zip(self.frames, self.ops_per_graph)):
            lines.append(f"Graph {i} ({frame}): {', '.join(opname(o) for o in ops) or '(no ops)'}")
        if self.break_reasons:
            lines.append("Break reasons (graph breaks, and frames run eagerly):")
            lines += [f"  {i + 1}. {r}" for i, r in enumerate(self.break_reasons)]
        if self.recompile_reasons:
            lines.append("Recompile reasons:")
            lines += [f"  {r}" for r in self.recompile_reasons]
        if self.guards:
            lines.append("Guards:")
            lines += [f"  {g}" for g in self.guards]
        return "\n".join(lines)

    __repr__ = __str__


def explain(fn: Callable[..., Any], *extra_args: Any, **extra_kwargs: Any):
    """`ferrodyn.explain(fn)(*args, **kwargs)` -> ExplainOutput. Resets ferrodyn first (as
    torch._dynamo.explain does), runs `fn` once compiled with the "eager" backend, and reports
    every graph captured and every frame that ran eagerly on the way."""
    if not callable(fn):
        raise TypeError(f"ferrodyn.explain expects a callable, got {type(fn).__name__}")

    def inner(*args: Any, **kwargs: Any) -> ExplainOutput:
        reset()
        out = ExplainOutput()
        convert_frame.recorders.append(out)
        try:
            compile(fn, backend="eager")(*args, **kwargs)
        finally:
            convert_frame.recorders.remove(out)
        return out

    if extra_args or extra_kwargs:
        warnings.warn("explain(f, *args) is deprecated; use explain(f)(*args)", FutureWarning, stacklevel=2)
        return inner(*extra_args, **extra_kwargs)
    return inner

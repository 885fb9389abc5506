"""The frame callback: what happens when the Rust hook misses its cache for a frame.

Owns the compile pipeline of one frame — skip rules, trace (`ferrodyn.symbolic.trace_frame`),
backend compile, guard compile, entry codegen, `_C.CacheEntry` — and the decisions around it:
which code is never traced (torch's, ferrodyn's, the standard library's: marked SKIP the first
time it is seen), what to do with unsupported frames (fullgraph: raise; otherwise run eagerly
and remember it, so the frame is not traced again for inputs like these), and the records that
`explain` and the logs read. Does not own the per-call hook (Rust) or the public API (api.py).

    hook miss ──► FrameCallback(frame)
                    ├─ skipped file / generator ──► skip_code, None (run normally)
                    ├─ at the cache limit / known-eager inputs ──► None
                    ├─ trace_frame ── Unsupported ──► fullgraph: raise │ else remember, None
                    ├─ backend(gm, example_inputs) ── raises ──► BackendCompilerFailed
                    ├─ guards.compile_guards(specs) ──► GuardTree
                    └─ codegen.generate_entry ──► CacheEntry (inserted and run by the hook)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import logging
import os
import sysconfig
import threading
import weakref
from types import CodeType
from typing import Any, Callable

import torch

from ferrodyn import _C, codegen, config, dynamic, resume, symbolic_shapes
from ferrodyn.exc import BackendCompilerFailed, BreakReason, Unsupported
from ferrodyn.guard_spec import GuardKind, GuardSpec
from ferrodyn.guards import GuardCompileError, compile_guards, has_accessor
from ferrodyn.logs import eager_log, graph_log, guards_log, recompiles_log
from ferrodyn.source import LocalSource
from ferrodyn.trace_result import Out, OutCall, OutDict, OutGraph, OutList, OutShared, OutTuple, TraceResult

_NO_TRACE_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen

# Unsupported reasons that cannot depend on the inputs: the code is marked SKIP at once.
_INPUT_INDEPENDENT = frozenset({BreakReason.UNSUPPORTED_OPCODE, BreakReason.GENERATOR})

log = logging.getLogger("ferrodyn")

# ---------------------------------------------------------------------------------------------
# Skip rules
# ---------------------------------------------------------------------------------------------

# Frames of attribute hooks run as they are (they are inlined where a traced frame calls them):
# the guards of their own entries would read attributes of the object through the very hook,
# re-entering it without end.
_ATTRIBUTE_HOOKS = frozenset({"__getattribute__", "__getattr__"})

# Code objects traced even though their file is skipped (OptimizedModule's inline frames).
_ALWAYS_TRACE: "weakref.WeakSet[CodeType]" = weakref.WeakSet()
# torch's own packages, the libraries torch depends on or whose frames show up inside compiled
# calls (audit hooks, progress bars), and libraries torch.compile skips as well.
_SKIPPED_LIBRARIES = ("torch", "functorch", "torchgen", "triton", "numpy", "sympy", "mpmath",
                      "filelock", "fsspec", "jinja2", "networkx", "typing_extensions", "_pytest",
                      "pluggy", "hypothesis", "tqdm", "tabulate", "pandas", "sklearn", "onnx",
                      "onnxruntime", "tensorflow", "tensorrt", "tvm")


def always_trace(code: CodeType) -> None:
    """Trace frames of `code` although its file is in a skipped directory."""
    _ALWAYS_TRACE.add(code)


@functools.cache
def _skip_prefixes() -> tuple[str, ...]:
    dirs = {os.path.dirname(os.path.abspath(__file__))}
    for lib in _SKIPPED_LIBRARIES:
        try:
            spec = importlib.util.find_spec(lib)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            dirs.update(os.path.abspath(p) for p in spec.submodule_search_locations)
    prefixes = [d.rstrip(os.sep) + os.sep for d in dirs]
    prefixes += list(config.skip_file_prefixes)
    return tuple(prefixes)


@functools.cache
def _stdlib_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({os.path.abspath(paths[k]).rstrip(os.sep) + os.sep for k in ("stdlib", "platstdlib")})


def skip_rules_changed() -> None:
    _skip_prefixes.cache_clear()


def is_skipped_file(filename: str) -> bool:
    """Whether code from `filename` is never traced: torch, ferrodyn, the standard library
    (site-packages excepted), frozen modules, fx-generated code, and config.skip_file_prefixes."""
    if filename.startswith("<"):
        return filename.startswith(("<frozen", "<eval_with_key>"))
    if filename.startswith(_skip_prefixes()):
        return True
    return filename.startswith(_stdlib_prefixes()) and "-packages" + os.sep not in filename


def _is_stdlib_generated(code: CodeType) -> bool:
    """Methods that `dataclasses` (`__init__`, `__eq__`, `__hash__`...) and
    `collections.namedtuple` (`__new__`) generate with `exec`/`eval`: never a frame worth a
    graph of its own (traced code that calls them inlines them), and torch's own dataclasses and
    namedtuples run them by the thousand while it compiles (`torch.cond` in eager code)."""
    if code.co_filename != "<string>":
        return False
    return code.co_qualname.startswith("__create_fn__.") or \
        (code.co_name == "<lambda>" and code.co_names == ("_tuple_new",))


# ---------------------------------------------------------------------------------------------
# State reset by ferrodyn.reset()
# ---------------------------------------------------------------------------------------------

# id(code) -> (weakref to code, [GuardTree]): inputs under which the frame is known to run eagerly
_eager_trees: dict[int, tuple[Any, list[Any]]] = {}
_frame_ids: dict[int, int] = {}
_frame_counter = itertools.count()
# id(backend) -> its backend id (1, 2, ...; never reused: a dead backend's mapping is dropped,
# so a new backend at the same address gets a fresh id). Not reset: entries keep their ids.
_backend_ids: dict[int, int] = {}
_backend_counter = itertools.count(1)
_backend_keep: list[Any] = []  # backends that cannot be weakly referenced: kept alive
# objects with on_graph(record) / on_eager(record): explain() listens here
recorders: list[Any] = []


def reset_state() -> None:
    global _frame_counter
    dynamic.reset_state()
    resume.reset_state()
    _eager_trees.clear()
    _frame_ids.clear()
    _frame_counter = itertools.count()


def _backend_id(backend: Any) -> int:
    """The id that ties a compiled entry to its backend: the hook runs an entry only for calls
    through a wrapper of the same backend (`_C.BackendCallback`), as torch.compile does."""
    key = id(backend)
    bid = _backend_ids.get(key)
    if bid is not None:
        return bid
    bid = _backend_ids[key] = next(_backend_counter)
    try:
        weakref.finalize(backend, _backend_ids.pop, key, None)
    except TypeError:  # not weakly referenceable: keep it, so its id is never reused
        _backend_keep.append(backend)
    return bid


def _compile_id(code: CodeType, n_entries: int) -> str:
    fid = _frame_ids.get(id(code))
    if fid is None:
        fid = _frame_ids[id(code)] = next(_frame_counter)
    return f"{fid}/{n_entries}"


def _where(code: CodeType) -> str:
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


# ---------------------------------------------------------------------------------------------
# Eager memory: "do not retrace this frame pointlessly"
# ---------------------------------------------------------------------------------------------

def _known_eager(code: CodeType, frame) -> bool:
    item = _eager_trees.get(id(code))
    if item is None or item[0]() is not code:
        return False
    return any(t.check(frame.args, frame.f_globals, frame.f_builtins, frame.closure) for t in item[1])


def _input_specs(code: CodeType, args: tuple) -> list[GuardSpec]:
    specs = [GuardSpec.make(None, GuardKind.GLOBAL_STATE)]
    for i, (name, value) in enumerate(zip(code.co_varnames, args)):
        src = LocalSource(i, name)
        if isinstance(value, torch.Tensor):
            specs.append(GuardSpec.make(src, GuardKind.TENSOR_MATCH, value))
        else:
            specs.append(GuardSpec.make(src, GuardKind.TYPE_MATCH, type(value)))
    return specs


def _remember_eager(code: CodeType, frame, exc: BaseException) -> None:
    reason = getattr(exc, "reason", None)
    if reason in _INPUT_INDEPENDENT:
        _C.skip_code(code)
        return
    key = id(code)
    item = _eager_trees.get(key)
    if item is None or item[0]() is not code:
        ref = weakref.ref(code, lambda _r, k=key: _eager_trees.pop(k, None))
        item = _eager_trees[key] = (ref, [])
    if len(item[1]) >= config.cache_size_limit:
        _C.skip_code(code)
        return
    specs = getattr(exc, "guards", None)
    specs = [*specs, GuardSpec.make(None, GuardKind.GLOBAL_STATE)] if specs else _input_specs(code, frame.args)
    try:
        item[1].append(compile_guards(specs, frame.f_globals, frame.f_builtins))
    except Exception:  # cannot express the inputs as guards: never trace this code again
        _C.skip_code(code)


# ---------------------------------------------------------------------------------------------
# Records (for explain and the logs)
# ---------------------------------------------------------------------------------------------

class GraphRecord:
    """One captured frame: its graph, guards and compile id."""

    def __init__(self, code, result: TraceResult, tree, compile_id: str, recompile_reasons):
        self.code = code
        self.graph = result.graph
        self.result = result
        self.guards = list(tree.leaves()) if hasattr(tree, "leaves") else [g.describe() for g in result.guards]
        self.compile_id = compile_id
        self.recompile_reasons = recompile_reasons


class EagerRecord:
    """One frame that runs eagerly, and why."""

    def __init__(self, code, exc: BaseException):
        self.code = code
        self.reason = str(exc)
        self.exception = exc


def graph_ops(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def graph_is_closed(gm: torch.fx.GraphModule) -> bool:
    """Whether running `gm`'s own generated forward can reach no traceable Python frame: no
    call_module nodes, and every call_function target is either not a Python function or one
    from a skipped file (torch's)."""
    for n in gm.graph.nodes:
        if n.op == "call_module":
            return False
        if n.op == "call_function":
            if _is_open_operator(n.target):
                return False
            code = getattr(n.target, "__code__", None)
            if code is not None and not is_skipped_file(code.co_filename):
                return False
    return True


# Operator namespaces whose kernels are torch's own C++ (or torch's Python decompositions).
_CLOSED_OP_NAMESPACES = frozenset({"aten", "prims"})


def _is_open_operator(target: Any) -> bool:
    """A dispatcher operator that may run user Python when called: a custom op
    (`torch.library.custom_op`, `torch.library.impl` in a user namespace: its implementation is
    the user's function) or a higher-order operator (it calls its subgraphs and bodies)."""
    if isinstance(target, torch._ops.HigherOrderOperator):
        return True
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace not in _CLOSED_OP_NAMESPACES
    if isinstance(target, torch._ops.OpOverloadPacket):  # `qualified name` is 'ns::op'
        return target._qualified_op_name.split("::")[0] not in _CLOSED_OP_NAMESPACES
    return False


def _is_fx_forward(fn: Any, gm: torch.fx.GraphModule) -> bool:
    return getattr(fn, "__self__", None) is gm and getattr(fn, "__func__", None) is type(gm).forward


def _uses_graph(out: Out) -> bool:
    if isinstance(out, OutGraph):
        return True
    if isinstance(out, (OutTuple, OutList)):
        return any(_uses_graph(i) for i in out.items)
    if isinstance(out, OutDict):
        return any(_uses_graph(v) for v in out.values)
    if isinstance(out, OutCall):
        return any(_uses_graph(a) for a in out.args)
    if isinstance(out, OutShared):
        return _uses_graph(out.value)
    return False


# ---------------------------------------------------------------------------------------------
# The callback
# ---------------------------------------------------------------------------------------------

# code -> the lock held while a frame of that code is compiled: one compile per code object at
# a time. A thread that misses while another compiles the same code runs its frame eagerly
# meanwhile (it never waits, so a compile that runs user code cannot deadlock against it);
# compiles of different code objects do not share a lock.
_compile_locks = _C.WeakIdKeyDictionary()
_compile_locks_guard = threading.Lock()


def _compile_lock(code: CodeType) -> threading.Lock:
    with _compile_locks_guard:
        lock = _compile_locks.get(code)
        if lock is None:
            lock = _compile_locks[code] = threading.Lock()
    return lock


def _exported_inputs(result: TraceResult) -> list:
    """The graph inputs the guard tree hands to the entry: the distinct ones that are not
    plain argument slots (reading those costs the entry nothing)."""
    out, seen = [], set()
    for src in result.graph_inputs:
        if not isinstance(src, LocalSource) and src not in seen and has_accessor(src):
            seen.add(src)
            out.append(src)
    return out


def _default_tracer():
    from ferrodyn.symbolic import trace_frame

    return trace_frame


_set_hooks_tracing = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)


@contextlib.contextmanager
def _saved_tensor_hooks_deferred():
    """The user's `saved_tensors_hooks` (activation checkpointing, offloading) must see the
    tensors autograd saves when the compiled graph RUNS, never the fake tensors that tracing
    and backend compiles make: torch defers pack hooks while this flag is set."""
    if _set_hooks_tracing is None:
        yield
        return
    prior = _set_hooks_tracing(True)
    try:
        yield
    finally:
        _set_hooks_tracing(prior)


class FrameCallback:
    """The thread's frame callback for one `ferrodyn.compile` call (one backend, one fullgraph
    setting). `tracer` is `trace_frame` unless a test supplies another."""

    def __init__(self, backend: Callable[..., Any], *, fullgraph: bool = False,
                 dynamic: bool | None = None, tracer: Callable[..., TraceResult] | None = None):
        self.backend = backend
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.tracer = tracer
        self.backend_id = _backend_id(backend)

    def __call__(self, frame) -> Any:
        code = frame.f_code
        if code.co_flags & _NO_TRACE_FLAGS or code.co_name in _ATTRIBUTE_HOOKS or \
                _is_stdlib_generated(code) or \
                (is_skipped_file(code.co_filename) and code not in _ALWAYS_TRACE):
            _C.skip_code(code)
            return None
        lock = _compile_lock(code)
        if not lock.acquire(blocking=False):
            return None  # another thread compiles this code right now: run this frame eagerly
        try:
            with _saved_tensor_hooks_deferred():
                return self.convert(frame)
        finally:
            lock.release()

    # -- the pipeline ---------------------------------------------------------------------
    def convert(self, frame) -> Any:
        code = frame.f_code
        entries = _C.cache_entries(code)
        # The limit counts every backend's entries; the recompile reasons only this backend's.
        mine = [e for e in entries if e.backend_id in (0, self.backend_id)]
        for e in mine:  # compiled by another thread between this frame's miss and its lock
            if e.guards.check(frame.args, frame.f_globals, frame.f_builtins, frame.closure):
                return e  # run it; the cache keeps the one copy it has
        reasons = self._recompile_reasons(code, frame, mine, len(entries)) if mine else []
        if len(entries) >= config.cache_size_limit:
            return None  # Rust runs the frame normally and warns once
        if _known_eager(code, frame):
            return None
        tracer = self.tracer or _default_tracer()
        try:
            result, policy = self._trace(tracer, code, frame)
        except Unsupported as e:
            if self.fullgraph:
                raise
            return self._run_eager(code, frame, e)
        except Exception as e:  # an internal error of the converter
            if self.fullgraph or not config.suppress_errors:
                raise
            log.warning("ferrodyn: internal error while tracing %s, running it eagerly: %s: %s",
                        _where(code), type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))
            return self._run_eager(code, frame, e)
        entry = self.compile_result(code, frame, result, n_entries=len(entries), reasons=reasons)
        if entry is not None:
            policy.commit()  # automatic dynamic: what this compile saw, for the next one
        return entry

    def _trace(self, tracer, code, frame):
        """Trace under the dynamic policy. Symbolic sizes or ints that meet something the
        converter cannot express symbolically (`range(n)`, an f-string) are specialised, as
        torch.compile specialises such a symbol: a failed symbolic trace is traced once more
        with them specialised, and a symbolic trace that needed a graph break is replaced by a
        specialised one that captures the frame whole, if there is one."""
        def attempt(mode, fullgraph: bool):
            with dynamic.policy_for(code, mode) as policy:
                try:
                    result = tracer(code, frame.f_globals, frame.f_builtins, frame.args,
                                    frame.closure, fullgraph=fullgraph)
                    return (result, policy), None, policy
                except Unsupported as e:
                    return None, e, policy

        done, err, policy = attempt(self.dynamic, self.fullgraph)
        if done is not None:
            if getattr(done[0], "graph_break", None) is None or not policy.symbolic:
                return done
            whole, _, _ = attempt(False, True)  # does specialising avoid the break?
            return whole if whole is not None else done
        if not policy.symbolic:
            raise err
        dynamic.dynamic_log.debug("%s: %s with symbolic sizes; specialising them",
                                  _where(code), err)
        done, err, _ = attempt(False, self.fullgraph)
        if done is None:
            raise err
        return done

    def compile_result(self, code, frame, result: TraceResult, *, n_entries: int = 0, reasons=()):
        gm = result.graph
        graph_fn, fence = None, True
        if result.read_is_compiling and not graph_ops(gm) and not self.fullgraph:
            # Nothing to capture, and the entry would hand `is_compiling()`'s folded True to
            # the frame's caller, which runs eagerly (transformers' `is_torchdynamo_compiling`
            # called from a frame torch.compile skipped): run it eagerly, as torch.compile
            # skips a frame without tensors.
            return self._run_eager(code, frame, Unsupported(
                "a frame with no graph op that reads torch.compiler.is_compiling()",
                BreakReason.OTHER, filename=code.co_filename, lineno=code.co_firstlineno))
        # A graph with ops runs even when no output is used: its ops may mutate inputs in place.
        if graph_ops(gm) or _uses_graph(result.output) or result.graph_has_effects or \
                any(_uses_graph(o) for o in result.side_effects):
            if graph_ops(gm):
                graph_fn = self.call_backend(gm, result.example_inputs)
            else:
                graph_fn = gm.forward  # nothing to compile: torch.compile skips the backend too
            fence = not (_is_fx_forward(graph_fn, gm) and graph_is_closed(gm))
        # Graph inputs reached through attribute/item chains (a module's parameters) are read
        # once, by the guard tree, and handed to the entry instead of read again there.
        exported = _exported_inputs(result) if graph_fn is not None else []
        try:
            # after the backend: it may add shape guards (mark_dynamic violations raise here)
            shape_specs = symbolic_shapes.shape_guard_specs(gm)
            specs = [*result.guards, *shape_specs, GuardSpec.make(None, GuardKind.GLOBAL_STATE)]
            tree = compile_guards(specs, frame.f_globals, frame.f_builtins, exports=exported)
        except (GuardCompileError, symbolic_shapes.ShapeGuardUnsupported) as e:
            err = Unsupported(f"cannot guard on this value: {e}", BreakReason.UNSUPPORTED_TYPE,
                              filename=code.co_filename, lineno=code.co_firstlineno)
            if self.fullgraph:
                raise err from e
            return self._run_eager(code, frame, err)
        try:
            fn = codegen.generate_entry(code, result, graph_fn, frame.f_globals, frame.f_builtins, fence=fence,
                                        exported=exported)
        except Exception as e:  # an output spec or source the codegen cannot express
            if self.fullgraph or not config.suppress_errors:
                raise
            log.warning("ferrodyn: cannot generate the entry of %s, running it eagerly: %s: %s",
                        _where(code), type(e).__name__, e)
            return self._run_eager(code, frame, e)
        compile_id = _compile_id(code, n_entries)
        direct = codegen.direct_call(code, result, graph_fn, fence=fence, exported=exported)
        entry = _C.CacheEntry(fn, tree, backend_id=self.backend_id, compile_id=compile_id,
                              direct=direct)
        self._log_compiled(code, gm, fn, tree, compile_id)
        if recorders:
            record = GraphRecord(code, result, tree, compile_id, list(reasons))
            for r in recorders:
                r.on_graph(record)
        return entry

    def call_backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        try:
            with symbolic_shapes.backend_context(gm):
                compiled = self.backend(gm, list(example_inputs))
        except Exception as e:
            raise BackendCompilerFailed(self.backend, e) from e
        if not callable(compiled):
            raise BackendCompilerFailed(self.backend, TypeError(
                f"the backend returned {type(compiled).__name__}, not a callable"))
        return compiled

    # -- eager, logs ------------------------------------------------------------------------
    def _run_eager(self, code, frame, exc: BaseException):
        _remember_eager(code, frame, exc)
        if eager_log.isEnabledFor(logging.DEBUG):
            eager_log.debug("running %s eagerly: %s", _where(code), exc)
        if config.verbose:
            import warnings

            warnings.warn(f"ferrodyn: running {_where(code)} eagerly: {exc}", stacklevel=2)
        if recorders:
            record = EagerRecord(code, exc)
            for r in recorders:
                r.on_eager(record)
        return None

    def _recompile_reasons(self, code, frame, entries, n_total: int) -> list[str]:
        if not (recompiles_log.isEnabledFor(logging.DEBUG) or recorders):
            return []
        reasons = []
        for e in entries:
            try:
                why = e.guards.explain(frame.args, frame.f_globals, frame.f_builtins, frame.closure)
            except Exception as err:  # explaining must never break compiling
                why = f"<could not explain: {err}>"
            reasons.append(f"[{e.compile_id}] {why}")
        if recompiles_log.isEnabledFor(logging.DEBUG):
            if n_total >= config.cache_size_limit:
                recompiles_log.debug("%s: cache_size_limit (%d) reached, running eagerly; failed guards:\n  %s",
                                     _where(code), config.cache_size_limit, "\n  ".join(reasons))
            else:
                recompiles_log.debug("recompiling %s: every cached entry failed its guards:\n  %s",
                                     _where(code), "\n  ".join(reasons))
        return reasons

    def _log_compiled(self, code, gm, fn, tree, compile_id) -> None:
        if graph_log.isEnabledFor(logging.DEBUG):
            graph_log.debug("graph [%s] of %s:\n%s\nentry:\n%s", compile_id, _where(code),
                            gm.print_readable(print_output=False),
                            getattr(fn, "__ferrodyn_source__", ""))
        if guards_log.isEnabledFor(logging.DEBUG):
            guards_log.debug("guards [%s] of %s:\n  %s", compile_id, _where(code),
                             "\n  ".join(tree.leaves()))


__all__ = ["FrameCallback", "is_skipped_file", "always_trace", "reset_state", "recorders"]


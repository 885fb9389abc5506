"""The graph being captured for one frame, and everything recorded next to it.

Owns: the `torch.fx.Graph` under construction, its placeholders (one per input Source, lifted
parameters and buffers included, so cached graphs do not pin modules), example values through a
`FakeTensorMode` made from the real inputs (with a ShapeEnv: dims the dynamic policy picks become
SymInts, their symbols lifted as SymInt placeholders before the tensor, as torch.compile
does; the capture's `ShapeRecord` rides on the GraphModule's meta), the guards installed while
tracing (deduplicated, in order), the per-Source tracker cache, the SideEffects table
(side_effects.py: identity of mutable objects, mutations to replay; its aliasing guard is
installed here), real global state entered while tracing (grad mode,
autocast) and its restoration, the grad-mode switches of the graph (those no op observes
are erased; a graph of switches alone is no graph: the entry sets the mode they leave), and
turning the frame's return tracker into a `TraceResult`.
Does not own: how trackers are built (variables/builder.py), which guards a value needs
(builder.py decides on use), compiling the graph or the guards (frontend).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.fx

from ferrodyn import dynamic, symbolic_shapes
from ferrodyn.exc import BreakReason
from ferrodyn.guard_spec import GuardKind, GuardSpec
from ferrodyn.side_effects import SideEffects, unshare
from ferrodyn.source import Source
from ferrodyn.trace_result import OutCall, OutConst, OutGraph, OutSource, TraceResult
from ferrodyn.variables.base import VariableTracker, unsupported


def _is_grad_switch(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target is torch._C._set_grad_enabled
            and len(node.args) == 1 and not node.kwargs and type(node.args[0]) is bool
            and not node.users)


class OutputGraph:
    """One capture: graph, inputs, guards. Shared by the root translator and every inlined one."""

    def __init__(self, f_globals: dict, f_builtins: dict):
        self.f_globals = f_globals
        self.f_builtins = f_builtins
        self.graph = torch.fx.Graph()
        self.dynamism = dynamic.current()
        self.fake_mode = symbolic_shapes.new_fake_mode("compile")
        self.shape_record = symbolic_shapes.ShapeRecord(self.fake_mode)
        self.bound_symbols: dict[Any, torch.fx.Node] = {}  # sympy Symbol -> its placeholder
        self._dynamic_dims: dict[Source, tuple[int, ...]] = {}
        self.graph_inputs: list[Source] = []
        self.example_inputs: list[Any] = []
        self._placeholders: list[torch.fx.Node] = []
        self._input_by_id: dict[int, VariableTracker] = {}
        self.guards: dict[GuardSpec, GuardSpec] = {}
        self.source_cache: dict[Source, VariableTracker] = {}
        self.side_effects = SideEffects()
        self.notes: list[str] = []
        self.read_is_compiling = False  # torch_fns: `torch.compiler.is_compiling()` folded
        self.mutation_epoch = 0  # bumped by every in-place op (invalidates folded tensors)
        self._name_counts: dict[str, int] = {}
        self._exit_stack = contextlib.ExitStack()
        self.grad_at_start = torch.is_grad_enabled()  # the frame's (guarded) grad mode
        # GraphModules of higher-order ops' bodies, reached by `get_attr` nodes (higher_order.py)
        self.subgraphs: dict[str, torch.nn.Module] = {}
        # (node, break path) of tensors made leaves by `requires_grad_` (requires_grad.py)
        self.requires_grad_leaves: list[tuple[torch.fx.Node, list]] = []
        # calls made for their effect only (`warnings.warn`), replayed by the entry after the
        # graph, in program order: (function, argument trackers, keyword names)
        self.install_guard(None, GuardKind.GLOBAL_STATE)

    # -- guards ------------------------------------------------------------------------------
    def install_guard(self, source: Source | None, kind: GuardKind, payload: Any = None) -> None:
        dims = self._dynamic_dims.get(source, ()) if kind is GuardKind.TENSOR_MATCH else ()
        spec = GuardSpec.make(source, kind, payload, dynamic_dims=dims)
        self.guards.setdefault(spec, spec)

    # -- real state entered while tracing -------------------------------------------------
    def enter_real(self, ctx: Any) -> None:
        """Enter a real context manager for the rest of the trace (restored by `close`)."""
        self._exit_stack.enter_context(ctx)

    def restore_on_close(self, fn: Callable[[], None]) -> None:
        self._exit_stack.callback(fn)

    def close(self) -> None:
        self._exit_stack.close()

    # -- graph inputs ---------------------------------------------------------------------
    def _placeholder_name(self, source: Source) -> str:
        raw = "".join(c if c.isalnum() else "_" for c in source.name())
        raw = "_".join(p for p in raw.split("_") if p)[:60] or "input"
        if raw[0].isdigit():
            raw = "i_" + raw
        n = self._name_counts.get(raw, 0)
        self._name_counts[raw] = n + 1
        return raw if n == 0 else f"{raw}_{n}"

    def add_graph_input(self, source: Source, value: torch.Tensor) -> tuple[torch.fx.Node, Any]:
        """A placeholder for a tensor read from `source`; returns (node, fake example)."""
        dyn, strict, duck = self.dynamism.dims_for(source, value)
        try:
            fake, ctx = symbolic_shapes.fake_input(self.fake_mode, value, source, dyn, strict,
                                                   duck=duck)
        except Exception as e:  # subclasses and exotic tensors
            unsupported(f"tensor input {source.name()} of type {type(value).__name__}: {e}",
                        BreakReason.UNSUPPORTED_TYPE)
        if ctx is not None and symbolic_shapes.is_symbolic(fake):
            self._dynamic_dims[source] = symbolic_shapes.symbolic_dims(fake)
            self.shape_record.dynamic_dims[source] = self._dynamic_dims[source]
            self.shape_record.inputs.append((fake, source, ctx))
            self.shape_record.contexts.append((value, ctx))
            for i, s in enumerate(fake.shape):  # lift each new size symbol before the tensor
                expr = s.node.expr if symbolic_shapes.is_symbolic(s) else None
                if expr is not None and expr.is_Symbol and expr not in self.bound_symbols:
                    self.bound_symbols[expr] = self._placeholder(
                        symbolic_shapes.TensorPropertySource(source, "size", i), s, s)
        return self._placeholder(source, fake, value), fake

    def add_symint_input(self, source: Source, value: int) -> tuple[torch.fx.Node | None, Any]:
        """A SymInt placeholder for the Python int at `source`; (None, value) when torch
        specialises it (0 and 1)."""
        sym = symbolic_shapes.symint_input(self.fake_mode.shape_env, value, source)
        if not symbolic_shapes.is_symbolic(sym):
            return None, value
        node = self._placeholder(source, sym, sym)
        self.bound_symbols.setdefault(sym.node.expr, node)
        self.shape_record.inputs.append((sym, source, None))
        return node, sym

    def _placeholder(self, source: Source, fake: Any, example_input: Any) -> torch.fx.Node:
        if self._placeholders:
            ctx = self.graph.inserting_after(self._placeholders[-1])
        elif len(self.graph.nodes):
            ctx = self.graph.inserting_before(next(iter(self.graph.nodes)))
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            node = self.graph.placeholder(self._placeholder_name(source))
        node.meta["example_value"] = fake
        node.meta["source"] = source
        self._placeholders.append(node)
        self.graph_inputs.append(source)
        self.example_inputs.append(example_input)
        return node

    # -- ops ------------------------------------------------------------------------------
    def create_node(self, op: str, target: Any, args: tuple, kwargs: dict) -> torch.fx.Node:
        return self.graph.create_node(op, target, tuple(args), dict(kwargs))

    def run_fake(self, fn: Callable[[], Any]) -> Any:
        if self.shape_record.inputs:  # symbolic sizes: meta kernels need the Python dispatcher
            from torch._dispatch.python import enable_python_dispatcher
            with self.fake_mode, enable_python_dispatcher():
                return fn()
        with self.fake_mode:
            return fn()

    # -- result ---------------------------------------------------------------------------
    def build_result(self, tx: Any, value: VariableTracker, *,
                     entry_sets_grad: bool = False) -> TraceResult:
        """The TraceResult of the capture, `value` its return value. A graph whose only ops
        are grad-mode switches is not a graph: its switches are erased and the entry sets the
        mode they leave behind (a first side effect). `entry_sets_grad`: the entry of a graph
        break, which sets the mode of the break itself after the graph (so a last switch of
        the graph is erased too, as torch's graphs end in the frame's mode)."""
        outputs: list[torch.fx.Node] = []
        index_of: dict[torch.fx.Node, int] = {}

        def graph_output(node: torch.fx.Node):
            if node.op == "placeholder":
                return OutSource(node.meta["source"])
            if node not in index_of:
                index_of[node] = len(outputs)
                outputs.append(node)
            return OutGraph(index_of[node])

        tx.graph_output = graph_output
        out = value.reconstruct(tx)
        (out,), effects = self.side_effects.replay(tx, (out,))
        out, *effects = unshare((out, *effects))
        mode = self._drop_grad_switches(entry_sets_grad)
        if mode is not None and not entry_sets_grad:
            effects.insert(0, OutCall(torch._C._set_grad_enabled, (OutConst(mode),)))
        from ferrodyn.variables.requires_grad import check_leaks
        check_leaks(self, outputs)
        self.graph.output(tuple(outputs))
        self.graph.lint()
        mutates = self._mutates_inputs()
        if mutates:
            self.side_effects.tensor_sensitive = True
            self._refuse_ndarray_overlap()
        self._install_aliasing_guard()
        root = torch.nn.Module()
        for name, sub in self.subgraphs.items():
            root.add_module(name, sub)
        gm = torch.fx.GraphModule(root, self.graph)
        gm.meta[symbolic_shapes.META_KEY] = self.shape_record
        return TraceResult(graph=gm, graph_inputs=list(self.graph_inputs),
                           example_inputs=list(self.example_inputs), output=out,
                           guards=list(self.guards.values()), notes=list(self.notes),
                           side_effects=tuple(effects), graph_has_effects=mutates,
                           read_is_compiling=self.read_is_compiling)

    def _drop_grad_switches(self, trailing: bool) -> bool | None:
        """Erase the grad-mode switches no op can observe (as torch's `cleanup_graph`, and
        its coalescing of switches to the current mode): one to the mode already set (from
        the frame's mode, which the guards fix), and one the next op of the graph overrides
        (another switch). The last switch after the last op is erased when `trailing` (the
        entry sets the mode after the graph) or when no op is left; then the mode it set
        is returned when no op is left (the entry sets it instead); else None."""
        ops = [n for n in self.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        if any(n.target is torch._C._set_grad_enabled and not _is_grad_switch(n) for n in ops):
            return None  # a switch to a mode not known here: leave them all
        mode, pending = self.grad_at_start, None  # the mode ops run under; a switch no op saw
        kept = []
        for n in ops:
            if not _is_grad_switch(n):
                if pending is not None:
                    mode, pending = pending.args[0], None
                kept.append(n)
                continue
            if pending is not None:  # overridden before any op ran under it
                self.graph.erase_node(pending)
                kept.remove(pending)
                pending = None
            if n.args[0] == mode:
                self.graph.erase_node(n)
            else:
                pending = n
                kept.append(n)
        if pending is None or not (trailing or kept == [pending]):
            return None
        self.graph.erase_node(pending)
        kept.remove(pending)
        return None if kept else pending.args[0]

    def _input_storages(self) -> set:
        from torch.multiprocessing.reductions import StorageWeakRef
        return {StorageWeakRef(n.meta["example_value"].untyped_storage())
                for n in self._placeholders
                if isinstance(n.meta.get("example_value"), torch.Tensor)}  # not SymInts

    def _writes_input(self, node: torch.fx.Node, inputs: set | None = None) -> bool:
        """Whether `node` is an in-place op writing to the storage of a graph input."""
        from torch.multiprocessing.reductions import StorageWeakRef
        from ferrodyn.variables.tensor import _is_inplace
        if node.op not in ("call_function", "call_method") or not node.args:
            return False
        if not (_is_inplace(node.op, node.target) or "out" in node.kwargs
                or node.kwargs.get("inplace") is True):
            return False
        inputs = self._input_storages() if inputs is None else inputs
        for arg in (*node.args, *node.kwargs.values()):
            ex = arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None
            if isinstance(ex, torch.Tensor) and StorageWeakRef(ex.untyped_storage()) in inputs:
                return True
        return False

    def _mutates_inputs(self) -> bool:
        """Whether an in-place op of the graph writes to the storage of a graph input."""
        if self.mutation_epoch == 0:
            return False
        inputs = self._input_storages()
        return any(self._writes_input(n, inputs) for n in self.graph.nodes)

    def _refuse_ndarray_overlap(self) -> None:
        """A graph that writes to its inputs, with an ndarray input beside another array
        input, is refused unless its one write to an input is its last op. The aliasing guard
        compares tensors' storages; an ndarray's memory can overlap another ndarray's
        (`f(a, a[1:])`) or a tensor's (`torch.from_numpy`) with no storage to compare, and a
        backend that functionalizes the writes (aot_eager, inductor) then computes what runs
        after a write from the stale input. A single last write (`a[...] = b`) reads nothing
        after it."""
        from ferrodyn.variables.numpy_graph import NumpyTensorSource
        sources = [n.meta.get("source") for n in self._placeholders
                   if isinstance(n.meta.get("example_value"), torch.Tensor)]
        if not any(isinstance(s, NumpyTensorSource) for s in sources) or len(sources) < 2:
            return
        ops = [n for n in self.graph.nodes if n.op in ("call_function", "call_method")]
        writes = [i for i, n in enumerate(ops) if self._writes_input(n)]
        if writes == [len(ops) - 1]:
            return
        from ferrodyn.variables.base import unsupported
        unsupported("a graph writing to its inputs with an ndarray input beside other array "
                    "inputs (their memory may overlap unseen)", BreakReason.SIDE_EFFECT)

    def _install_aliasing_guard(self) -> None:
        payload = self.side_effects.aliasing_guard_payload()
        if payload is not None:
            self.install_guard(None, GuardKind.ALIASING, payload)

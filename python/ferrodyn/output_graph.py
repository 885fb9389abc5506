"""The graph being captured for one frame, and everything recorded next to it.

Owns: the `torch.fx.Graph` under construction, its placeholders (one per input Source, lifted
parameters and buffers included, so cached graphs do not pin modules), example values through a
`FakeTensorMode` made from the real inputs, the guards installed while tracing (deduplicated, in
order), the per-Source tracker cache, the SideEffects table (side_effects.py: identity of
mutable objects, mutations to replay; its aliasing guard is installed here), real global state entered while tracing (grad mode,
autocast) and its restoration, and turning the frame's return tracker into a `TraceResult`.
Does not own: how trackers are built (variables/builder.py), which guards a value needs
(builder.py decides on use), compiling the graph or the guards (frontend).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from ferrodyn.exc import BreakReason
from ferrodyn.guard_spec import GuardKind, GuardSpec
from ferrodyn.side_effects import SideEffects, unshare
from ferrodyn.source import Source
from ferrodyn.trace_result import OutGraph, OutSource, TraceResult
from ferrodyn.variables.base import VariableTracker, unsupported


class OutputGraph:
    """One capture: graph, inputs, guards. Shared by the root translator and every inlined one."""

    def __init__(self, f_globals: dict, f_builtins: dict):
        self.f_globals = f_globals
        self.f_builtins = f_builtins
        self.graph = torch.fx.Graph()
        self.fake_mode = FakeTensorMode()
        self.graph_inputs: list[Source] = []
        self.example_inputs: list[Any] = []
        self._placeholders: list[torch.fx.Node] = []
        self._input_by_id: dict[int, VariableTracker] = {}
        self.guards: dict[GuardSpec, GuardSpec] = {}
        self.source_cache: dict[Source, VariableTracker] = {}
        self.side_effects = SideEffects()
        self.notes: list[str] = []
        self.mutation_epoch = 0  # bumped by every in-place op (invalidates folded tensors)
        self._name_counts: dict[str, int] = {}
        self._exit_stack = contextlib.ExitStack()
        # calls made for their effect only (`warnings.warn`), replayed by the entry after the
        # graph, in program order: (function, argument trackers, keyword names)
        self.install_guard(None, GuardKind.GLOBAL_STATE)

    # -- guards ------------------------------------------------------------------------------
    def install_guard(self, source: Source | None, kind: GuardKind, payload: Any = None) -> None:
        spec = GuardSpec.make(source, kind, payload)
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
        if self._placeholders:
            ctx = self.graph.inserting_after(self._placeholders[-1])
        elif len(self.graph.nodes):
            ctx = self.graph.inserting_before(next(iter(self.graph.nodes)))
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            node = self.graph.placeholder(self._placeholder_name(source))
        try:
            fake = self.fake_mode.from_tensor(value, static_shapes=True)
        except Exception as e:  # subclasses and exotic tensors
            unsupported(f"tensor input {source.name()} of type {type(value).__name__}: {e}",
                        BreakReason.UNSUPPORTED_TYPE)
        node.meta["example_value"] = fake
        node.meta["source"] = source
        self._placeholders.append(node)
        self.graph_inputs.append(source)
        self.example_inputs.append(value)
        return node, fake

    # -- ops ------------------------------------------------------------------------------
    def create_node(self, op: str, target: Any, args: tuple, kwargs: dict) -> torch.fx.Node:
        return self.graph.create_node(op, target, tuple(args), dict(kwargs))

    def run_fake(self, fn: Callable[[], Any]) -> Any:
        with self.fake_mode:
            return fn()

    # -- result ---------------------------------------------------------------------------
    def build_result(self, tx: Any, value: VariableTracker) -> TraceResult:
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
        self.graph.output(tuple(outputs))
        self.graph.lint()
        mutates = self._mutates_inputs()
        if mutates:
            self.side_effects.tensor_sensitive = True
        self._install_aliasing_guard()
        gm = torch.fx.GraphModule(torch.nn.Module(), self.graph)
        return TraceResult(graph=gm, graph_inputs=list(self.graph_inputs),
                           example_inputs=list(self.example_inputs), output=out,
                           guards=list(self.guards.values()), notes=list(self.notes),
                           side_effects=tuple(effects), graph_has_effects=mutates)

    def _mutates_inputs(self) -> bool:
        """Whether an in-place op of the graph writes to the storage of a graph input."""
        from torch.multiprocessing.reductions import StorageWeakRef
        from ferrodyn.variables.tensor import _is_inplace
        if self.mutation_epoch == 0:
            return False
        inputs = {StorageWeakRef(n.meta["example_value"].untyped_storage())
                  for n in self._placeholders}
        for node in self.graph.nodes:
            if node.op not in ("call_function", "call_method") or not node.args:
                continue
            if not (_is_inplace(node.op, node.target) or "out" in node.kwargs
                    or node.kwargs.get("inplace") is True):
                continue
            for arg in (*node.args, *node.kwargs.values()):
                ex = arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None
                if isinstance(ex, torch.Tensor) and StorageWeakRef(ex.untyped_storage()) in inputs:
                    return True
        return False

    def _install_aliasing_guard(self) -> None:
        payload = self.side_effects.aliasing_guard_payload()
        if payload is not None:
            self.install_guard(None, GuardKind.ALIASING, payload)

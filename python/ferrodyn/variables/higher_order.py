"""Subgraph speculation: trace a Python callable into a child graph, the body of a higher-order
op (`tag_activation_checkpoint`, `cond`), as torch.compile's `speculate_subgraph` does.

`speculate_subgraph(tx, fn, args, kwargs, what)` runs the callable's bytecode with a new
InstructionTranslator over a `SubgraphOutput`: the parent's FakeTensorMode and shape record,
the parent's SideEffects table (so pending attributes/globals and object identity read as in
the parent), a Source cache that falls back to the parent's, and its own fx graph, guards and
placeholders. Every tensor of the parent the body uses is *lifted*: a parent node used by a
child node becomes a child placeholder (in order of first use; nested subgraphs lift through
each level), a tensor first read inside the body (a global, a parameter) becomes a parent graph
input and then a child placeholder. The result (`Subgraph`) is the child's GraphModule, the
parent nodes to pass for its placeholders, the output trackers' examples and the structure
of the body's return value (tensors, constants, tuples/lists of those).

The speculation refuses (raises Unsupported; the caller graph-breaks at the HOP call, so the
frame is traced again and stops before it: no state of the failed speculation survives)
when the body has an effect visible outside it: a mutation logged by the SideEffects table
(existing containers, attribute/global/cell stores, replayed calls such as print), a change to
any mutable state reachable from the callable, its arguments or the table's pending values
(new lists/dicts/sets/objects/cells of the parent trace, compared field by field, so a body
that only reads may be refused but never one that writes is accepted), an in-place write to a
lifted input, a new dynamic int input, or a return value that is not tensors/constants or
returns a lifted input itself. Trackers built inside the body are dropped from the identity
table afterwards (they hold child nodes); tensors first read there are registered in the
parent like any graph input. Guards installed by the body are copied to the parent.

Owns `SubgraphOutput`, `Subgraph`, `speculate_subgraph`, `install_subgraph`.
Does not own which callables are higher-order ops or the node each emits
(higher_order_ops.py), inlining (symbolic/inline.py), or the root graph (output_graph.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.output_graph import OutputGraph
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.lists import ListVariable, TupleVariable
from ferrodyn.variables.tensor import TensorVariable


class _ChainedCache(dict):
    """The child's Source cache: its own entries first, then the parent's (read only)."""

    def __init__(self, parent: dict):
        super().__init__()
        self.parent = parent

    def get(self, key, default=None):
        hit = dict.get(self, key)
        return hit if hit is not None else self.parent.get(key, default)


class SubgraphOutput(OutputGraph):
    """The graph of one higher-order op body, traced inside the parent's capture."""

    def __init__(self, parent: OutputGraph):
        super().__init__(parent.f_globals, parent.f_builtins)
        self.parent = parent
        self.fake_mode = parent.fake_mode
        self.shape_record = parent.shape_record
        self.bound_symbols = parent.bound_symbols
        self.dynamism = parent.dynamism
        self._dynamic_dims = parent._dynamic_dims  # tensor guards of lifted inputs stay dynamic
        self.side_effects = parent.side_effects
        self.source_cache = _ChainedCache(parent.source_cache)
        self.lifted: list[torch.fx.Node] = []              # parent node of each placeholder
        self._lift_of: dict[torch.fx.Node, torch.fx.Node] = {}  # parent node -> placeholder
        self.new_inputs: list[tuple[Any, Any, torch.fx.Node, Any]] = []  # root graph inputs made

    # -- lifting -----------------------------------------------------------------------------
    def lift(self, node: torch.fx.Node) -> torch.fx.Node:
        """The child placeholder standing for `node` of an enclosing graph."""
        if node.graph is self.graph:
            return node
        hit = self._lift_of.get(node)
        if hit is not None:
            return hit
        outer = node
        if node.graph is not self.parent.graph:
            if not isinstance(self.parent, SubgraphOutput):
                unsupported("a value of another graph used in a higher-order op body",
                            BreakReason.UNSUPPORTED_CALL)
            outer = self.parent.lift(node)
        anchor = self._placeholders[-1] if self._placeholders else None
        if anchor is not None:
            ctx = self.graph.inserting_after(anchor)
        elif len(self.graph.nodes):
            ctx = self.graph.inserting_before(next(iter(self.graph.nodes)))
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            ph = self.graph.placeholder(_safe_name(outer.name, self._name_counts))
        ph.meta["example_value"] = outer.meta.get("example_value")
        self._placeholders.append(ph)
        self.lifted.append(outer)
        self._lift_of[node] = ph
        if outer is not node:
            self._lift_of[outer] = ph
        return ph

    def own_input(self, example: torch.Tensor, name: str) -> TensorVariable:
        """A placeholder of the body's own (a loop-carried value, a slice of a mapped tensor):
        before any lifted one; `example` is a fresh fake tensor of this graph."""
        if self.lifted:
            raise AssertionError("own inputs come before lifted ones")
        ph = self.graph.placeholder(_safe_name(name, self._name_counts))
        ph.meta["example_value"] = example
        self._placeholders.append(ph)
        return TensorVariable(node=ph, example=example, cls=torch.Tensor)

    def add_graph_input(self, source, value):
        """A tensor first read inside the body: an input of the parent, lifted."""
        node, fake = _existing_input(self.parent, source)
        if node is None:
            node, fake = self.parent.add_graph_input(source, value)
            self.new_inputs.append((source, value, node, fake))
        return self.lift(node), fake

    def add_symint_input(self, source, value):
        unsupported(f"a higher-order op body reads the int {source.name()} as a dynamic size",
                    BreakReason.UNSUPPORTED_CALL)

    def create_node(self, op, target, args, kwargs):
        args = torch.fx.node.map_arg(tuple(args), self.lift)
        kwargs = torch.fx.node.map_arg(dict(kwargs), self.lift)
        return self.graph.create_node(op, target, tuple(args), dict(kwargs))

    def module(self) -> torch.fx.GraphModule:
        root = torch.nn.Module()
        for name, sub in self.subgraphs.items():
            root.add_module(name, sub)
        return torch.fx.GraphModule(root, self.graph)


def _existing_input(out: OutputGraph, source) -> tuple[Any, Any]:
    for node in out._placeholders:
        if node.meta.get("source") == source:
            return node, node.meta.get("example_value")
    return None, None


def _safe_name(raw: str, counts: dict) -> str:
    n = counts.get(raw, 0)
    counts[raw] = n + 1
    return raw if n == 0 else f"{raw}_{n}"


# ---- effects the body may not have -------------------------------------------------------------

def _shallow(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(id(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((id(k), id(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return (type(value), frozenset(id(v) for v in value))
    return id(value)


def _children(value: Any):
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    if isinstance(value, dict):
        return (*value.keys(), *value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name, None) for f in dataclasses.fields(value)
                if f.name not in _REAL_FIELDS]
    return ()


# fields holding real Python objects (not trackers): never walked
_REAL_FIELDS = frozenset({"value", "obj", "fn", "source", "node", "example", "cls"})


def _is_state(value: Any) -> bool:
    """A mutable tracker state (a non-frozen dataclass: ListState, DictState, CellState...)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type) and \
        not type(value).__dataclass_params__.frozen


def _snapshot(roots) -> dict[int, tuple[Any, tuple]]:
    """Every mutable state reachable from `roots`: id -> (state, its fields' shallow values)."""
    seen: set[int] = set()
    states: dict[int, tuple[Any, tuple]] = {}
    stack = list(roots)
    while stack:
        v = stack.pop()
        if id(v) in seen or v is None or isinstance(v, (int, float, str, bytes, bool, torch.Tensor,
                                                         torch.fx.Node, type)):
            continue
        seen.add(id(v))
        if _is_state(v):
            states[id(v)] = (v, tuple(_shallow(getattr(v, f.name, None))
                                      for f in dataclasses.fields(v)))
        if isinstance(v, (VariableTracker, list, tuple, dict, set, frozenset)) or _is_state(v):
            stack.extend(c for c in _children(v) if isinstance(
                c, (VariableTracker, list, tuple, dict, set, frozenset)) or _is_state(c))
    return states


def _changed(before: dict[int, tuple[Any, tuple]]) -> bool:
    for state, fields in before.values():
        now = tuple(_shallow(getattr(state, f.name, None)) for f in dataclasses.fields(state))
        if now != fields:
            return True
    return False


# ---- the speculation ----------------------------------------------------------------------------

@dataclass
class Subgraph:
    """A traced body: its GraphModule, the parent nodes its placeholders stand for, the
    examples of its outputs, and the return value's structure (`spec`: a TensorVariable
    index `("t", i)`, a constant `("c", value)`, or `(tuple|list, [specs])`)."""

    module: torch.fx.GraphModule
    lifted: list[torch.fx.Node]      # after the body's own inputs (`stand_ins`)
    examples: list[Any]
    spec: Any
    output: SubgraphOutput


def _output_spec(tx, what: str, value: VariableTracker, outs: list, child: SubgraphOutput):
    value = tx.realize(value)
    if isinstance(value, TensorVariable):
        if value.node.graph is not child.graph or value.node.op == "placeholder":
            unsupported(f"{what} returns one of its inputs unchanged", BreakReason.UNSUPPORTED_CALL)
        if any(o.node is value.node for o in outs):
            unsupported(f"{what} returns one tensor twice", BreakReason.UNSUPPORTED_CALL)
        outs.append(value)
        return ("t", len(outs) - 1)
    if isinstance(value, ConstantVariable) and type(value.value) in (type(None), int, float, bool):
        return ("c", value.value)
    if type(value) in (TupleVariable, ListVariable):
        kind = tuple if isinstance(value, TupleVariable) else list
        return (kind, [_output_spec(tx, what, i, outs, child) for i in value.unpack(tx)])
    unsupported(f"{what} returns {value.describe()} (only tensors, constants and tuples/lists of "
                f"those are captured)", BreakReason.UNSUPPORTED_TYPE)


def fresh_fake(tx, example: torch.Tensor) -> torch.Tensor:
    """A new fake tensor with `example`'s metadata (and requires_grad), no autograd history."""
    def make():
        t = example.detach().clone()
        return t.requires_grad_(True) if example.requires_grad else t
    return tx.output.run_fake(make)


def speculate_subgraph(tx, fn: VariableTracker, args: list, kwargs: dict, what: str,
                       stand_ins: tuple = (), bare_output: bool = False,
                       pack=None) -> Subgraph:
    """Trace `fn(*own, *args, **kwargs)` into a child graph of `tx.output`, `own` being one
    fresh placeholder per fake tensor of `stand_ins` (the body's own inputs, first); raises
    Unsupported at the caller's call when the body cannot be captured exactly. `bare_output`:
    a body returning one tensor outputs it alone (not a 1-tuple: while_loop's cond_fn).
    `pack`: own trackers -> the positional arguments standing for them (associative_scan's
    combine_fn takes the two halves as pytrees)."""
    from ferrodyn.symbolic.translator import InstructionTranslator
    parent = tx.output
    table = parent.side_effects
    child = SubgraphOutput(parent)
    mark = table.mark()
    before = _snapshot([fn, *args, *kwargs.values(), *table.held_values()])
    grad = torch.is_grad_enabled()
    try:
        own = [child.own_input(ex, f"child_{i}") for i, ex in enumerate(stand_ins)]
        stx = InstructionTranslator(tx.code, tx.f_globals, child, {}, {}, tx.globals_source)
        own = list(pack(own)) if pack is not None else own
        out = stx.realize(fn.call_function(stx, [*own, *args], dict(kwargs)))
        if table.logged_since(mark):
            unsupported(f"{what} has side effects", BreakReason.SIDE_EFFECT)
        if _changed(before):
            unsupported(f"{what} mutates a value from outside it", BreakReason.SIDE_EFFECT)
        if child._mutates_inputs():
            unsupported(f"{what} writes in place to a tensor from outside it",
                        BreakReason.SIDE_EFFECT)
        if torch.is_grad_enabled() != grad:
            unsupported(f"{what} leaves grad mode changed", BreakReason.SIDE_EFFECT)
        outs: list[TensorVariable] = []
        spec = _output_spec(stx, what, out, outs, child)
        if bare_output and spec == ("t", 0):
            child.graph.output(outs[0].node)
        else:
            child.graph.output(tuple(o.node for o in outs))
        child.graph.lint()
        gm = child.module()
    except Unsupported as e:
        # the break happens at the caller's call: no path into the speculation
        raise Unsupported(f"{what}: {e.construct}", BreakReason.UNSUPPORTED_CALL) from None
    except Exception as e:  # a traced exception escaping the body, an internal error
        raise Unsupported(f"{what}: {type(e).__name__} while tracing: {e}",
                          BreakReason.UNSUPPORTED_CALL) from None
    finally:
        child.close()
        torch._C._set_grad_enabled(grad)
        # trackers built inside the body hold child nodes: the parent rebuilds what it reads
        table.restore_identity(mark)
    for source, value, node, fake in child.new_inputs:  # as the builder registers an input
        var = TensorVariable(source=source, node=node, example=fake, cls=type(value))
        parent.source_cache.setdefault(source, var)
        table.track(value, source, var)
    for g in child.guards.values():
        parent.guards.setdefault(g, g)
    return Subgraph(module=gm, lifted=list(child.lifted),
                    examples=[o.example for o in outs], spec=spec, output=child)


def install_subgraph(out: OutputGraph, prefix: str, gm: torch.fx.GraphModule) -> torch.fx.Node:
    """Install `gm` as a submodule of the graph being built; the `get_attr` node reading it."""
    i = 0
    while f"{prefix}_{i}" in out.subgraphs:
        i += 1
    name = f"{prefix}_{i}"
    out.subgraphs[name] = gm
    return out.create_node("get_attr", name, (), {})


def rebuild_output(tx, spec, items: list[VariableTracker]) -> VariableTracker:
    """The tracker of a body's return value from its structure and the output trackers."""
    if spec[0] == "t":
        return items[spec[1]]
    if spec[0] == "c":
        return ConstantVariable(value=spec[1])
    kind, parts = spec
    values = [rebuild_output(tx, p, items) for p in parts]
    return TupleVariable(items=tuple(values)) if kind is tuple else ListVariable.new(values)


def same_structure(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "t":
        return a[1] == b[1]
    if a[0] == "c":
        return a[1] == b[1] and type(a[1]) is type(b[1])
    return len(a[1]) == len(b[1]) and all(same_structure(x, y) for x, y in zip(a[1], b[1]))

"""Symbolic integers (and the floats computed from them, `n ** 0.5`): a dynamic size (`x.shape[0]`, `x.size(1)`, `x.numel()`) or a Python int
argument made dynamic, as an fx node plus its example `torch.SymInt`.

Owns `SymIntVariable`, the builtins that keep a SymInt symbolic (`sym_convert`: int/float/
math.ceil/floor/trunc; `sym_minmax`: max/min as torch.sym_max/sym_min), `concrete` (a SymInt
specialised under a ShapeEnv guard where Python needs the number), `item_of` (`.item()` as an
unbacked SymInt under capture_scalar_outputs; Python decisions on it break the graph),
`SizeVariable` (a `torch.Size` with symbolic items), the size item of
a tensor (`size_item`: the lifted placeholder of a bound symbol, else `x.size(i)` in the graph)
and `maybe_symint_input` (a frame int -> SymInt graph input under the dynamic policy). Arithmetic
on SymInts is recorded like tensor ops (operators.py -> `record_op`); comparisons and truth
evaluate with a ShapeEnv guard, as torch does. A SymInt is never a Python constant: a use that
needs the number (`range(s)`) specialises it through `concrete`, which guards; other uses the
converter cannot express symbolically give up instead of specialising silently.
Does not own which ints are dynamic (dynamic.py) or making the SymInts (symbolic_shapes.py).
"""

from __future__ import annotations

import contextlib
import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from ferrodyn import symbolic_shapes
from ferrodyn.exc import BreakReason
from ferrodyn.guard_spec import GuardKind
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.lists import TupleVariable


@dataclass(frozen=True, eq=False)
class SymIntVariable(VariableTracker):
    node: torch.fx.Node = None  # type: ignore[assignment]
    example: Any = None  # torch.SymInt (or torch.SymFloat)

    def python_type(self) -> type:
        ex = self.example
        return float if isinstance(ex, torch.SymFloat) else bool if isinstance(ex, torch.SymBool) \
            else int

    def identity(self) -> Any:
        return self.node

    def describe(self) -> str:
        return f"symbolic int {self.example}"

    def fx_arg(self, tx):
        return self.node, self.example

    def truth(self, tx) -> bool:
        with data_dependent_breaks("the truth"):
            if isinstance(self.example, torch.SymBool):
                return bool(self.example)
            return bool(self.example != 0)  # guards on the ShapeEnv

    def reconstruct(self, tx):
        return tx.graph_output(self.node)

    def call_method(self, tx, name, args, kwargs):
        from ferrodyn.variables.tensor import record_op
        if name.startswith("__") and name.endswith("__"):
            return record_op(tx, "call_method", name, [self, *args], kwargs)
        unsupported(f"int.{name}() on a symbolic int", BreakReason.UNSUPPORTED_CALL)


# Conversions that return a SymInt unchanged (`int(s)`, `math.ceil(s)`), as CPython returns an
# int itself; on a SymFloat (`s / 2`) each is recorded (`math.ceil` -> a SymInt node), and
# `float(s)` is torch.sym_float. A conversion torch answers with a plain value (`int(f)` of a
# SymFloat) guards in the ShapeEnv and becomes a constant (record_op -> wrap_symint).
_IDENTITY_ON_INT = frozenset({int, math.ceil, math.floor, math.trunc, operator.index})
_CONVERSIONS = {int: int, float: torch.sym_float, math.ceil: math.ceil, math.floor: math.floor,
                math.trunc: math.trunc}
_MINMAX = {max: torch.sym_max, min: torch.sym_min}


@contextlib.contextmanager
def data_dependent_breaks(what: str):
    """A Python decision on a value read from a tensor (an unbacked SymInt of `.item()`) has no
    guard: the graph breaks there, as in torch."""
    try:
        yield
    except GuardOnDataDependentSymNode as e:
        unsupported(f"{what} of a value read from a tensor: {str(e).splitlines()[0]}",
                    BreakReason.DATA_DEPENDENT)


def item_of(tx, tensor) -> VariableTracker:
    """`x.item()` under capture_scalar_outputs: an unbacked SymInt/SymFloat graph value (its
    symbol bound to the node, as torch's `unbacked_bindings`)."""
    from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings
    from ferrodyn.variables.tensor import record_op
    out = record_op(tx, "call_method", "item", [tensor], {})
    if isinstance(out, SymIntVariable):
        bindings = compute_unbacked_bindings(tx.output.fake_mode.shape_env, out.example)
        if bindings:
            out.node.meta["unbacked_bindings"] = bindings
    return out


def sym_convert(tx, fn, value) -> VariableTracker | None:
    """`fn(value)` for a builtin conversion of a symbolic int/float; None: not symbolic or not
    one of them (the caller decides)."""
    from ferrodyn.variables.tensor import record_op
    v = tx.realize(value)
    if not isinstance(v, SymIntVariable):
        return None
    if fn in _IDENTITY_ON_INT and v.python_type() is int:
        return v
    target = _CONVERSIONS.get(fn)
    return None if target is None else record_op(tx, "call_function", target, [v], {})


def concrete(tx, value) -> VariableTracker:
    """`value`, with a symbolic int replaced by its concrete value under a ShapeEnv guard
    (`Eq(s0, 3)`: the entry is for that value only), as torch specialises a symbol used where
    Python needs the number (`range(s)`, `f"{s}"`, `str(s)`). SymFloats are left as they are
    (their guards would be float expressions)."""
    v = tx.realize(value)
    if isinstance(v, SymIntVariable) and v.python_type() is int:
        with data_dependent_breaks("the value"):
            return ConstantVariable(value=int(v.example))  # guard_int: records Eq(expr, value)
    return v


def sym_minmax(tx, fn, items) -> VariableTracker | None:
    """`max(a, b, ...)` / `min(...)` over symbolic and constant ints as torch.sym_max/sym_min
    nodes (ints only: the result equals CPython's, whichever equal item it would pick); None
    when no item is symbolic or one is not an int."""
    from ferrodyn.variables.tensor import record_op
    vals = [tx.realize(i) for i in items]
    if not any(isinstance(v, SymIntVariable) for v in vals):
        return None
    for v in vals:
        if isinstance(v, SymIntVariable) and v.python_type() is int:
            continue
        if isinstance(v, ConstantVariable) and type(v.value) is int:
            continue
        return None
    acc = vals[0]
    for v in vals[1:]:
        acc = record_op(tx, "call_function", _MINMAX[fn], [acc, v], {})
    return acc


@dataclass(frozen=True, eq=False)
class SizeVariable(TupleVariable):
    """`x.shape` / `x.size()` with symbolic items; rebuilt as a torch.Size."""

    def python_type(self):
        return torch.Size

    def describe(self):
        return f"torch.Size of {len(self.items)}"

    def getitem(self, tx, index):
        got = super().getitem(tx, index)
        return SizeVariable(items=got.items) if isinstance(got, TupleVariable) else got

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutCall, OutTuple
        return OutCall(torch.Size, (OutTuple(tuple(tx.realize(i).reconstruct(tx)
                                                   for i in self.items)),))

    def call_method(self, tx, name, args, kwargs):
        if name == "numel" and not args and not kwargs:
            from ferrodyn.variables.operators import binary_op
            import operator
            acc: VariableTracker = ConstantVariable(value=1)
            for item in self.items:
                acc = binary_op(tx, operator.mul, acc, item)
            return acc
        return super().call_method(tx, name, args, kwargs)


def wrap_symint(tx, node: torch.fx.Node, example: Any) -> VariableTracker:
    """A graph value whose example is a SymInt or SymFloat (SymBool: evaluated with a
    guard)."""
    if isinstance(example, torch.SymBool):
        try:
            value = bool(example)
        except GuardOnDataDependentSymNode:  # on a value read from a tensor: kept as a graph
            node.meta["example_value"] = example  # value, its truth breaks (at the jump)
            return SymIntVariable(node=node, example=example)
        if not node.users:
            tx.output.graph.erase_node(node)
        return ConstantVariable(value=value)
    const = example.node.maybe_as_float() if isinstance(example, torch.SymFloat) else \
        example.node.maybe_as_int()
    if const is not None:
        if not node.users:
            tx.output.graph.erase_node(node)
        return ConstantVariable(value=const)
    node.meta["example_value"] = example
    return SymIntVariable(node=node, example=example)


def size_item(tx, tensor, i: int) -> VariableTracker:
    """Item `i` of a tensor tracker's size: a constant, or a SymInt read from the graph."""
    s = tensor.example.shape[i]
    if not symbolic_shapes.is_symbolic(s):
        return ConstantVariable(value=int(s))
    bound = tx.output.bound_symbols.get(s.node.expr)
    if bound is not None:
        return SymIntVariable(node=bound, example=s)
    node = tx.output.create_node("call_method", "size", (tensor.node, i), {})
    node.meta["example_value"] = s
    return SymIntVariable(node=node, example=s)


def size_of(tx, tensor) -> VariableTracker:
    """`x.shape` / `x.size()`: a constant torch.Size when static."""
    if not any(symbolic_shapes.is_symbolic(s) for s in tensor.example.shape):
        return ConstantVariable(value=torch.Size(int(s) for s in tensor.example.shape))
    return SizeVariable(items=tuple(size_item(tx, tensor, i)
                                    for i in range(tensor.example.dim())))


@dataclass(frozen=True, eq=False)
class SliceVariable(VariableTracker):
    """A slice with symbolic bounds (`x[: x.shape[0] // 2]`): usable as a graph-op argument."""

    parts: tuple = ()

    def python_type(self) -> type:
        return slice

    def describe(self) -> str:
        return "slice with symbolic bounds"

    def fx_arg(self, tx):
        ps, es = zip(*(p.fx_arg(tx) for p in self.parts))
        return slice(*ps), slice(*es)


def symbolic_slice(parts) -> VariableTracker:
    """BUILD_SLICE / BINARY_SLICE with a symbolic bound; other non-constant bounds give up."""
    if not all(isinstance(p, (SymIntVariable, ConstantVariable)) for p in parts) or \
            not all(isinstance(p, SymIntVariable) or type(p.value) in (int, type(None))
                    for p in parts):
        unsupported("slice with non-constant bounds", BreakReason.DATA_DEPENDENT)
    return SliceVariable(parts=tuple(parts))


def maybe_symint_input(tx, value: int, source) -> VariableTracker | None:
    """A SymInt graph input for the frame int at `source` when the policy makes it dynamic
    (None: specialise it as a constant; 0 and 1 always are)."""
    out = tx.output
    if not out.dynamism.int_is_dynamic(source, value):
        return None
    node, example = out.add_symint_input(source, value)
    if node is None:
        return None
    out.install_guard(source, GuardKind.TYPE_MATCH, int)
    return SymIntVariable(source=source, node=node, example=example)

"""Tensor trackers and the one place where a tensor operation becomes an fx node.

Owns `TensorVariable` (an fx node plus its fake example value), `record_op` (convert tracker
arguments to fx arguments, run the op on fake tensors, add the node, wrap the result), the
table of tensor attributes (constant metadata vs graph attributes vs `.grad` of graph inputs
read as inputs vs refused), the `out=` checks and the table of tensor methods the graph cannot
express. A fake run that raises DataDependentOutputException asks tensor_rewrites.py first.
Does not own which torch functions are called how (torch_fns.py) or Python operators
(operators.py).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)

from ferrodyn import symbolic_shapes
from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable, is_constant_value
from ferrodyn.variables.torch_const_calls import folds_without_inputs

# Tensor attributes that are metadata: with static shapes they are constants of the trace,
# guarded by the tensor's TENSOR_MATCH guard.
CONST_ATTRS = frozenset({
    "shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_cpu",
    "layout", "is_sparse", "is_quantized", "is_meta", "is_nested", "is_mkldnn", "itemsize",
    "nbytes", "is_mps", "is_xpu",
})
# Attributes computed from the data: graph nodes (`getattr(x, "T")`).
GRAPH_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag"})
# Attributes the trace cannot model (autograd state, storage, versions).
REFUSED_ATTRS = {
    "grad": BreakReason.SIDE_EFFECT, "data": BreakReason.SIDE_EFFECT,
    "_version": BreakReason.SIDE_EFFECT, "grad_fn": BreakReason.UNSUPPORTED_TYPE,
    "_base": BreakReason.UNSUPPORTED_TYPE,
}
# Methods whose result depends on tensor data or that act outside the graph.
REFUSED_METHODS = {
    "item": BreakReason.DATA_DEPENDENT, "tolist": BreakReason.DATA_DEPENDENT,
    "__bool__": BreakReason.DATA_DEPENDENT,
    "__int__": BreakReason.DATA_DEPENDENT, "__float__": BreakReason.DATA_DEPENDENT,
    "__index__": BreakReason.DATA_DEPENDENT, "data_ptr": BreakReason.DATA_DEPENDENT,
    "backward": BreakReason.SIDE_EFFECT, "register_hook": BreakReason.SIDE_EFFECT,
    "retain_grad": BreakReason.SIDE_EFFECT,
    "storage": BreakReason.UNSUPPORTED_TYPE, "untyped_storage": BreakReason.UNSUPPORTED_TYPE,
    "set_": BreakReason.SIDE_EFFECT, "share_memory_": BreakReason.SIDE_EFFECT,
    "apply_": BreakReason.UNSUPPORTED_CALL, "map_": BreakReason.UNSUPPORTED_CALL,
    "register_post_accumulate_grad_hook": BreakReason.SIDE_EFFECT,
    "__setstate__": BreakReason.SIDE_EFFECT, "__reduce_ex__": BreakReason.UNSUPPORTED_CALL,
}


@dataclass(frozen=True, eq=False)
class TensorVariable(VariableTracker):
    node: torch.fx.Node = None  # type: ignore[assignment]
    example: Any = None
    cls: type = torch.Tensor
    # For tensors made by a factory from constants (`torch.tensor(3.0)`): the real value,
    # valid until any in-place op is recorded (epoch), so `.item()` can fold.
    const: Any = None
    const_epoch: int = -1

    def const_value(self, tx) -> Any:
        if self.const is not None and self.const_epoch == tx.output.mutation_epoch:
            return self.const
        return None

    def python_type(self) -> type:
        return self.cls

    def identity(self) -> Any:
        return self.node

    def describe(self) -> str:
        return f"tensor {self.node.name}"

    def var_getattr(self, tx, name):
        if name == "__class__":
            from ferrodyn.variables.builder import build_unsourced
            return build_unsourced(self.cls)
        if name in _SHAPE_ATTRS:
            return _SHAPE_ATTRS[name](tx, self)
        if name in CONST_ATTRS:
            value = getattr(self.example, name)
            if isinstance(value, torch.SymInt):  # nbytes & co. of a dynamic tensor
                return record_op(tx, "call_function", getattr, [self, ConstantVariable(value=name)], {})
            return ConstantVariable(value=value)
        if name in GRAPH_ATTRS:
            return record_op(tx, "call_function", getattr, [self, ConstantVariable(value=name)], {})
        if name in _INPUT_ATTRS and self.source is not None and \
                self.node.op == "placeholder":
            return _INPUT_ATTRS[name](tx, self)
        if name in REFUSED_ATTRS:
            unsupported(f"tensor attribute .{name}", REFUSED_ATTRS[name])
        if callable(getattr(torch.Tensor, name, None)):
            return TensorMethodVariable(tensor=self, name=name)
        unsupported(f"tensor attribute .{name}", BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        if hasattr(self.cls, name):  # methods and properties: the class answers for every tensor
            return hasattr(self.example, name)
        # an instance attribute (`x.flag = True` before the call): in the real tensor's
        # __dict__, which the fake example does not carry
        if self.source is None:
            if self.node.op == "placeholder":
                unsupported(f"hasattr({self.describe()}, {name!r})", BreakReason.UNSUPPORTED_TYPE)
            return False  # made by this trace (tensor attribute stores are refused)
        real = _input_value(tx, self)
        d = getattr(real, "__dict__", None)
        if not isinstance(d, dict):
            unsupported(f"hasattr({self.describe()}, {name!r})", BreakReason.UNSUPPORTED_TYPE)
        from ferrodyn.guard_spec import GuardKind
        from ferrodyn.source import DictOfSource
        if name in d:
            tx.output.install_guard(DictOfSource(self.source), GuardKind.DICT_KEYS, tuple(d))
            return True
        tx.output.install_guard(DictOfSource(self.source), GuardKind.DICT_LACKS, name)
        return False

    def call_method(self, tx, name, args, kwargs):
        return call_tensor_method(tx, self, name, args, kwargs)

    def truth(self, tx):
        const = self.const_value(tx)
        if const is not None:
            return bool(const)
        unsupported(f"truth value of {self.describe()}", BreakReason.DATA_DEPENDENT)

    def length(self, tx):
        if self.example.dim() == 0:
            unsupported("len() of a 0-d tensor", BreakReason.EXCEPTION)
        return int(self.example.shape[0])

    def unpack(self, tx):
        return [self.getitem(tx, ConstantVariable(value=i)) for i in range(self.length(tx))]

    def getitem(self, tx, index):
        return record_op(tx, "call_function", operator.getitem, [self, index], {})

    def setitem(self, tx, index, value):
        record_op(tx, "call_function", operator.setitem, [self, index, value], {})

    def contains(self, tx, item):
        unsupported("`in` on a tensor", BreakReason.DATA_DEPENDENT)

    def setattr(self, tx, name, value):
        unsupported(f"setting tensor attribute .{name}", BreakReason.SIDE_EFFECT)

    def fx_arg(self, tx):
        return self.node, self.example

    def reconstruct(self, tx):
        return tx.graph_output(self.node)


@dataclass(frozen=True, eq=False)
class TensorMethodVariable(VariableTracker):
    """`x.name` for a tensor method, before the call."""

    tensor: TensorVariable = None  # type: ignore[assignment]
    name: str = ""

    def describe(self) -> str:
        return f"tensor method .{self.name}"

    def call_function(self, tx, args, kwargs):
        return call_tensor_method(tx, self.tensor, self.name, args, kwargs)


_CONST_FOLDABLE_METHODS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__",
                                     "__index__"})
CONST_FACTORIES = frozenset({torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.full,
                             torch.zeros, torch.ones, torch.arange, torch.linspace, torch.eye})


def call_tensor_method(tx, tensor: TensorVariable, name: str, args, kwargs) -> VariableTracker:
    const = tensor.const_value(tx)
    if const is not None and name in _CONST_FOLDABLE_METHODS and not args and not kwargs:
        from ferrodyn.variables.constant import fold, wrap_constant
        return wrap_constant(fold(getattr(const, name)))
    if name == "item" and not args and not kwargs and symbolic_shapes.capture_scalar_outputs():
        from ferrodyn.variables.sym_int import item_of
        return item_of(tx, tensor)  # an unbacked SymInt/SymFloat, as torch
    if name in REFUSED_METHODS:
        unsupported(f"Tensor.{name}()", REFUSED_METHODS[name])
    if name in _SHAPE_METHODS:
        return _SHAPE_METHODS[name](tx, tensor, args, kwargs)
    if name in _CONVERSION_METHODS:
        return _CONVERSION_METHODS[name](tx, tensor, args, kwargs)
    if name in _AUTOGRAD_METHODS:
        return _AUTOGRAD_METHODS[name](tx, tensor, args, kwargs)
    if name == "__iter__" and not args and not kwargs:  # iter(self.unbind(0)): its rows
        return tensor.iterator(tx)
    return record_op(tx, "call_method", name, [tensor, *args], kwargs)


def _size_method(tx, tensor, args, kwargs):
    """`x.size()` / `x.size(d)`: constants when static, SymInt trackers when dynamic."""
    from ferrodyn.variables.sym_int import size_item, size_of
    if kwargs or len(args) > 1:
        return record_op(tx, "call_method", "size", [tensor, *args], kwargs)
    if not args:
        return size_of(tx, tensor)
    dim = tx.realize(args[0])
    if not dim.is_python_constant() or type(dim.as_python_constant()) is not int:
        return record_op(tx, "call_method", "size", [tensor, *args], kwargs)
    d, n = dim.as_python_constant(), tensor.example.dim()
    if not -n <= d < n:
        unsupported(f"Tensor.size({d}) of a {n}-d tensor", BreakReason.EXCEPTION)
    return size_item(tx, tensor, d % n)


def _shape_attr(tx, tensor):
    from ferrodyn.variables.sym_int import size_of
    return size_of(tx, tensor)


def _grad_of_input(tx, tensor):
    """`p.grad` of a graph input: the real `.grad` (None, guarded to stay None, or a tensor:
    a graph input of its own, identity-tracked so `p.grad is g` holds). Nothing in a graph can
    rebind `.grad` (backward and `.grad = ...` are refused), so the value read holds for the
    whole graph. A tensor made by the trace has no real `.grad` to read: still refused."""
    from ferrodyn.source import AttrSource
    from ferrodyn.variables.builder import build
    real = _input_value(tx, tensor)
    return build(tx, real.grad, AttrSource(tensor.source, "grad"))


# Attributes of graph inputs read from the real tensor (else refused, REFUSED_ATTRS).
_INPUT_ATTRS = {"grad": _grad_of_input}


def _numpy_method(tx, tensor, args, kwargs):
    from ferrodyn.variables.numpy_vars import tensor_numpy
    return tensor_numpy(tx, tensor, args, kwargs)


# Conversions to another library's values: `x.numpy()`, an ndarray sharing x's memory.
_CONVERSION_METHODS = {"numpy": _numpy_method}
# Shape queries answered from the fake example (symbolic under dynamic shapes).
_SHAPE_METHODS = {"size": _size_method}
_SHAPE_ATTRS = {"shape": _shape_attr}


def _requires_grad_method(tx, tensor, args, kwargs):
    from ferrodyn.variables.requires_grad import requires_grad_
    return requires_grad_(tx, tensor, args, kwargs)


# Autograd metadata changes modelled as effects local to the graph (requires_grad.py)
_AUTOGRAD_METHODS = {"requires_grad_": _requires_grad_method}


# ---- recording ------------------------------------------------------------------------------

def fx_args(tx, args, kwargs):
    pa, ea, pk, ek = [], [], {}, {}
    for a in args:
        p, e = tx.realize(a).fx_arg(tx)
        pa.append(p)
        ea.append(e)
    for k, v in kwargs.items():
        p, e = tx.realize(v).fx_arg(tx)
        pk[k] = p
        ek[k] = e
    return pa, ea, pk, ek


def _input_value(tx, var: "TensorVariable") -> Any:
    """The real tensor behind a graph input (its placeholder's example input)."""
    out = tx.output
    for node, value in zip(out._placeholders, out.example_inputs):
        if node is var.node:
            return value
    unsupported(f"{var.describe()}: no real value at compile time", BreakReason.UNSUPPORTED_TYPE)


def _target_name(kind: str, target: Any) -> str:
    if kind == "call_method":
        return f"Tensor.{target}"
    mod = getattr(target, "__module__", None) or ""
    return f"{mod}.{getattr(target, '__name__', target)}" if mod else str(target)


def fx_nameable(target: Any) -> bool:
    """Whether the code torch.fx generates for a `call_function` node can name `target`. fx
    names a callable from torch by its qualified name (`torch.<module>.<__name__>`) and looks it
    up at run time; a function whose `__name__` was rewritten (a `functools.wraps` wrapper such as
    the function `torch.vmap` returns) is not there, and the graph would fail when called."""
    try:
        from torch.fx.graph import _is_from_torch
        from torch.fx.node import _get_qualified_name
    except ImportError:  # fx internals moved: nothing to check against
        return True
    try:
        if not _is_from_torch(target):
            return True
        parts = _get_qualified_name(target).split(".")
    except Exception:
        return False
    obj = torch if parts[0] == "torch" else None
    for part in parts[1:]:
        obj = getattr(obj, part, None)
    return obj is target


def record_op(tx, kind: str, target: Any, args, kwargs) -> VariableTracker:
    """Add `target(*args, **kwargs)` to the graph (`kind`: call_function / call_method) after
    running it on fake tensors; non-tensor results become constants (the node is dropped)."""
    if kind == "call_function" and not fx_nameable(target):
        unsupported(f"{_target_name(kind, target)}: a torch callable that a graph cannot name "
                    f"(its __name__ is not where it lives)", BreakReason.UNSUPPORTED_CALL)
    pa, ea, pk, ek = fx_args(tx, args, kwargs)

    def run():
        if kind == "call_method":
            return getattr(ea[0], target)(*ea[1:], **ek)
        return target(*ea, **ek)

    name = _target_name(kind, target)
    out_shapes = _out_shapes(ek.get("out"))
    try:
        example = tx.output.run_fake(run)
    except Unsupported:
        raise
    except DataDependentOutputException as e:
        # a 0-d tensor where the schema takes a Scalar: an equivalent call on tensor operands
        from ferrodyn.variables.tensor_rewrites import rewrite_scalar_tensor_call
        rewritten = rewrite_scalar_tensor_call(tx, kind, target, args, kwargs)
        if rewritten is not None:
            return rewritten
        unsupported(f"{name}: {type(e).__name__}", BreakReason.DATA_DEPENDENT)
    except DynamicOutputShapeException as e:
        unsupported(f"{name}: {type(e).__name__}", BreakReason.DATA_DEPENDENT)
    except UnsupportedOperatorException as e:
        unsupported(f"{name}: operator without a fake implementation ({e})",
                    BreakReason.UNSUPPORTED_CALL)
    except Exception as e:
        if "data-dependent" in str(e) or "data dependent" in str(e):
            unsupported(f"{name}: {e}", BreakReason.DATA_DEPENDENT)
        unsupported(f"{name} raised {type(e).__name__}: {e}", BreakReason.EXCEPTION)
    if out_shapes is not None:
        _check_out_tensors(name, ek["out"], out_shapes)
    if example is not None and kind == "call_function" and is_constant_value(example) and \
            not _contains_tensor([ea, list(ek.values())]) and \
            not _contains_symbolic([ea, list(ek.values())]) and not folds_without_inputs(target):
        unsupported(f"{name}: a constant result of a torch callable no traced value reaches "
                    f"(it may read process state no guard checks)", BreakReason.UNSUPPORTED_CALL)
    node = tx.output.create_node(kind, target, tuple(pa), pk)
    if _is_inplace(kind, target) or "out" in ek or ek.get("inplace") is True:
        tx.output.mutation_epoch += 1
    for arg, fake in zip(args, ea):
        arg = tx.realize(arg)
        if example is fake and isinstance(arg, TensorVariable):
            # the op returned one of its inputs (`x.add_(1)`, `x += 1`): same tensor, same
            # tracker, so `is` and later uses see one object
            node.meta["example_value"] = example
            return arg
    result = wrap_graph_value(tx, node, example, name)
    if kind == "call_function" and target in CONST_FACTORIES and \
            isinstance(result, TensorVariable) and not _contains_tensor([ea, list(ek.values())]) \
            and not _contains_symbolic([ea, list(ek.values())]):  # a real call would specialise
        try:
            real = target(*ea, **ek)
        except Exception:
            return result
        return TensorVariable(node=result.node, example=result.example, cls=result.cls,
                              const=real, const_epoch=tx.output.mutation_epoch)
    return result


def _out_shapes(out: Any) -> Any:
    """The shapes of an `out=` tensor (or list of them) before the op."""
    if isinstance(out, torch.Tensor):
        return out.shape
    if isinstance(out, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in out):
        return [t.shape for t in out]
    return None


def _check_out_tensors(name: str, out: Any, before: Any) -> None:
    """Refuse an `out=` call that resized its out tensor or writes a non-dense one, as
    TorchDynamo does (functionalization in aot/inductor backends does not replay either on a
    graph input; the eager backend would, but the graph must hold for every backend)."""
    outs, shapes = ([out], [before]) if isinstance(out, torch.Tensor) else (out, before)
    for t, shape in zip(outs, shapes):
        if t.shape != shape:
            unsupported(f"{name} with out= resizing its out tensor from {tuple(shape)} to "
                        f"{tuple(t.shape)}", BreakReason.SIDE_EFFECT)
        if not (t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last) or
                t.is_contiguous(memory_format=torch.channels_last_3d)):
            unsupported(f"{name} with a non-contiguous out= tensor", BreakReason.SIDE_EFFECT)


_INPLACE_OPERATORS = frozenset({
    operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul, operator.ilshift,
    operator.irshift, operator.iand, operator.ior, operator.ixor,
})


def _is_inplace(kind: str, target: Any) -> bool:
    if kind == "call_method":
        return target.endswith("_") and not target.endswith("__")
    if target in _INPLACE_OPERATORS:
        return True
    name = getattr(target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def _contains_symbolic(value: Any) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, (tuple, list)):
        return any(_contains_symbolic(v) for v in value)
    return False


def _contains_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_contains_tensor(v) for v in value)
    return False


def wrap_graph_value(tx, node: torch.fx.Node, example: Any, name: str = "op") -> VariableTracker:
    if isinstance(example, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        from ferrodyn.variables.sym_int import wrap_symint
        return wrap_symint(tx, node, example)
    if isinstance(example, torch.Tensor):
        node.meta["example_value"] = example
        return TensorVariable(node=node, example=example, cls=torch.Tensor)
    if isinstance(example, (tuple, list)) and (_contains_tensor(example) or any(
            isinstance(v, (torch.SymInt, torch.SymBool)) for v in example)):
        node.meta["example_value"] = example
        items = []
        for i, v in enumerate(example):
            if _contains_tensor(v) or isinstance(v, (torch.SymInt, torch.SymBool)):
                item_node = tx.output.create_node("call_function", operator.getitem, (node, i), {})
                items.append(wrap_graph_value(tx, item_node, v, name))
            elif is_constant_value(v):
                items.append(ConstantVariable(value=v))
            else:
                unsupported(f"{name} returned a {type(v).__name__}", BreakReason.UNSUPPORTED_TYPE)
        from ferrodyn.variables.lists import ListVariable, TupleVariable
        from ferrodyn.variables.namedtuple_vars import NamedTupleVariable
        if type(example) is list:
            return ListVariable.new(items)
        if type(example) is tuple:
            return TupleVariable(items=tuple(items))
        return NamedTupleVariable.make(type(example), items)
    if example is None:
        return ConstantVariable(value=None)  # keep the node: it ran for its effect
    if is_constant_value(example):
        if not node.users:
            tx.output.graph.erase_node(node)
        return ConstantVariable(value=example)
    unsupported(f"{name} returned a {type(example).__name__}", BreakReason.UNSUPPORTED_TYPE)

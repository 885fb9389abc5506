"""`torch.tensor(data)` whose data holds traced values, and `torch._shape_as_tensor(x)`.

Eager `torch.tensor([t, 3])` reads each 0-d tensor with `.item()`; a fake tensor has no data
("data is not allocated"). The call is recorded as `torch._refs.tensor` (torch's Python
reference: each element `.to(dtype)` then `torch.stack`), as TorchDynamo does, where that gives
eager's result: its casts are unchecked tensor casts where eager converts a Python number into
`dtype` and raises (a float into an integer dtype, a complex into a real one, an int that
overflows a narrower integer dtype), so those calls are refused (graph break; eager raises).
`torch._shape_as_tensor(x)` is eager's int64 CPU tensor of `x.size()` (TorchDynamo answers the
torch.Size itself, another type), made by the same path.

Owns these two handlers (registered in torch_fns.TORCH_HANDLERS). Does not own constant
factories (`torch.tensor(3.0)`, folded by tensor.record_op) or recording.
"""

from __future__ import annotations

from typing import Any

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable

def _kind(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def _fits(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether every value of `src` converts into `dst` as eager's number conversion does."""
    ks, kd = _kind(src), _kind(dst)
    if ks > kd:
        return False
    if ks == 1 and kd == 1:
        a, b = torch.iinfo(src), torch.iinfo(dst)
        return b.min <= a.min and a.max <= b.max
    return True


def _leaves(tx, var: VariableTracker, out: list) -> bool:
    """Collect the numbers and tensors of nested lists/tuples; False if something else is
    inside (the call is then recorded as it is, as before this handler)."""
    from ferrodyn.variables.sym_int import SymIntVariable
    from ferrodyn.variables.tensor import TensorVariable
    var = tx.realize(var)
    if isinstance(var, (TensorVariable, SymIntVariable)) or var.is_python_constant() and \
            not isinstance(var.as_python_constant(), (list, tuple)):
        out.append(var)
        return True
    try:
        if var.python_type() not in (list, tuple, torch.Size):
            return False
        items = var.unpack(tx)
    except Exception:
        return False
    return all(_leaves(tx, item, out) for item in items)


def _leaf_fits(leaf: VariableTracker, dtype: torch.dtype) -> bool:
    from ferrodyn.variables.sym_int import SymIntVariable
    from ferrodyn.variables.tensor import TensorVariable
    if isinstance(leaf, TensorVariable):
        return _fits(leaf.example.dtype, dtype)
    if isinstance(leaf, SymIntVariable):
        src = torch.float64 if isinstance(leaf.example, torch.SymFloat) else \
            torch.bool if isinstance(leaf.example, torch.SymBool) else torch.int64
        return _fits(src, dtype)
    try:  # a constant: eager's own conversion decides
        torch.tensor(leaf.as_python_constant(), dtype=dtype)
    except Exception:
        return False
    return True


def tensor_ctor(tx, args, kwargs) -> VariableTracker:
    """TORCH_HANDLERS[torch.tensor]."""
    from ferrodyn.variables.sym_int import SymIntVariable
    from ferrodyn.variables.tensor import TensorVariable, record_op
    data = args[0] if args else kwargs.get("data")
    data = tx.realize(data) if data is not None else None
    if data is None or isinstance(data, TensorVariable) or data.is_python_constant():
        return record_op(tx, "call_function", torch.tensor, args, kwargs)
    leaves: list = []
    if not _leaves(tx, data, leaves) or \
            not any(isinstance(v, (TensorVariable, SymIntVariable)) for v in leaves):
        return record_op(tx, "call_function", torch.tensor, args, kwargs)
    if len(args) > 1 or set(kwargs) - {"data", "dtype", "device"}:
        unsupported("torch.tensor of traced values with these arguments",
                    BreakReason.UNSUPPORTED_CALL)
    opts = {k: tx.realize(v) for k, v in kwargs.items() if k != "data"}
    if not all(v.is_python_constant() for v in opts.values()):
        unsupported("torch.tensor with a traced dtype/device", BreakReason.UNSUPPORTED_CALL)
    dtype = opts["dtype"].as_python_constant() if "dtype" in opts else None
    if dtype is not None and not all(_leaf_fits(v, dtype) for v in leaves):
        unsupported(f"torch.tensor of traced values into {dtype}: eager converts each number "
                    f"with checks a tensor cast does not make", BreakReason.DATA_DEPENDENT)
    return record_op(tx, "call_function", torch._refs.tensor, [data], opts)


def shape_as_tensor(tx, args, kwargs) -> VariableTracker:
    """TORCH_HANDLERS[torch._shape_as_tensor]: `torch.tensor(x.size(), dtype=int64)`."""
    from ferrodyn.variables.lists import ListVariable
    from ferrodyn.variables.tensor import TensorVariable, call_tensor_method
    if len(args) != 1 or kwargs or not isinstance(tx.realize(args[0]), TensorVariable):
        unsupported("torch._shape_as_tensor with these arguments", BreakReason.UNSUPPORTED_CALL)
    size = tx.realize(call_tensor_method(tx, tx.realize(args[0]), "size", [], {}))
    items = ListVariable.new(size.unpack(tx))
    return tensor_ctor(tx, [items], {"dtype": ConstantVariable(value=torch.int64)})


def handlers() -> dict[Any, Any]:
    return {torch.tensor: tensor_ctor, torch._shape_as_tensor: shape_as_tensor}

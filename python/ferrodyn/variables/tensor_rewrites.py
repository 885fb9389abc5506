"""Rewrites of torch ops called with a 0-d tensor where their schema takes a Scalar.

`torch._foreach_lerp_(xs, ys, torch.tensor(0.5))`, `x.addcmul_(y, z, value=t)`,
`torch._foreach_pow(t, exps)`: eager converts the 0-d tensor to a Python number (`.item()`),
which a fake tensor cannot do (DataDependentOutputException). Optimizers pass such tensors
(tensor betas/lr; `step` tensors while compiling). Each row of `SCALAR_TENSOR_REWRITES` says
which parameter is the Scalar and emits equivalent ops that take the tensor as a tensor
operand, chosen so the values are the eager ones bit for bit:

- the same kernel with a tensor operand in place of the Scalar (`lerp.Tensor` for
  `lerp.Scalar`; `pow(Tensor, Tensor)`, which `pow(Scalar, Tensor)` itself calls; `add/sub`
  of a tensor, which `add/sub(Tensor, Scalar)` call with the Scalar wrapped). Not `pow(Tensor,
  Scalar)` (its Scalar kernel special-cases exponents 2, 0.5, -1...: other roundings) nor an
  `alpha=` Scalar (the vectorized kernel computes `a + alpha * b` as one fused multiply-add);
- `addcmul/addcdiv(self, t1, t2, value=s)` as `addcmul/addcdiv(self, s * t1, t2)`: the
  kernels compute `self + ((value * t1) <op> t2)`, so `value * t1` rounded once, then the same
  expression with value 1; only where no op math type differs from the dtype (float32,
  float64, integers).

The 0-d tensor is cast to the op's computation dtype as eager casts the Scalar; a row refuses
(returns None: the caller breaks the graph) where that cast could raise in eager (a float64
Scalar that overflows float32 is an error there, `inf` here), where autograd would record the
call (eager detaches the Scalar; the rewrite would not) and for reduced-precision dtypes.
Only CPU tensors are rewritten (CUDA's fused foreach kernels associate differently, and no
GPU has checked them). Every rewrite is checked against the op run on fake tensors with the
0-d tensor replaced by a Python number of its kind: the same result types, shapes and aliasing
(in-place ops return their inputs), else the call is refused.

Owns the table and its checks. Does not own recording ops (tensor.py's `record_op`, which
calls `rewrite_scalar_tensor_call` when a fake run raises DataDependentOutputException).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable

# dtypes whose CPU/GPU op math type is the dtype itself (no widening inside the kernels)
_SAME_OPMATH = frozenset({torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
                          torch.int32, torch.int64})


def _placeholder(example: torch.Tensor) -> Any:
    """The Python number `.item()` would give, in kind (its value does not change types)."""
    if example.dtype == torch.bool:
        return True
    if example.dtype.is_complex:
        return 1 + 0j
    if example.dtype.is_floating_point:
        return 1.0
    return 1


def _cast_is_exact(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether casting a `src` tensor to `dst` gives what eager's Scalar conversion gives
    (`Scalar.to<dst>()` raises where a float64 overflows float32 and where a float goes to an
    integer type; a tensor cast would not)."""
    if src == dst:
        return True
    if src.is_complex or dst.is_complex or src == torch.bool:
        return False
    if src.is_floating_point and not dst.is_floating_point:
        return False
    return not (src == torch.float64 and dst != torch.float64)


def _tensors(tx, var: VariableTracker) -> list | None:
    """The TensorVariables of a list/tuple argument, or None."""
    from ferrodyn.variables.tensor import TensorVariable
    var = tx.realize(var)
    if isinstance(var, TensorVariable):
        return None
    try:
        items = [tx.realize(v) for v in var.unpack(tx)]
    except Exception:
        return None
    return items if all(isinstance(v, TensorVariable) for v in items) else None


def _op(tx, kind: str, target: Any, *args, **kwargs) -> VariableTracker:
    from ferrodyn.variables.tensor import record_op
    return record_op(tx, kind, target, list(args), kwargs)


def _as_dtype(tx, scalar, dtype: torch.dtype):
    """`scalar` (a 0-d tensor tracker) in `dtype`, or None where eager's conversion differs."""
    if not _cast_is_exact(scalar.example.dtype, dtype):
        return None
    if scalar.example.dtype == dtype:
        return scalar
    return _op(tx, "call_method", "to", scalar, ConstantVariable(value=dtype))


def _container(ref: Any, items: list) -> VariableTracker:
    from ferrodyn.variables.lists import ListVariable, TupleVariable
    if type(ref) is list:
        return ListVariable.new(items)
    return TupleVariable(items=tuple(items))


# ---- the rewrites: each takes the bound arguments and the reference result ------------------

def _lerp_weight(tx, scalar, dtype):
    if dtype in (torch.float32, torch.float64):
        return _as_dtype(tx, scalar, dtype)
    return scalar if scalar.example.dtype == dtype else None  # a reduced type: exact only as is


def _foreach_lerp(inplace: bool):
    def emit(tx, b, ref):
        selfs, ends = _tensors(tx, b["self"]), _tensors(tx, b["tensors1"])
        if selfs is None or ends is None or len(selfs) != len(ends):
            return None
        out = []
        for x, y in zip(selfs, ends):
            w = _lerp_weight(tx, b["weight"], x.example.dtype)
            if w is None:
                return None
            out.append(_op(tx, "call_method", "lerp_", x, y, w) if inplace
                       else _op(tx, "call_function", torch.lerp, x, y, w))
        return tx.realize(b["self"]) if inplace else _container(ref, out)
    return emit


def _lerp(inplace: bool):
    def emit(tx, b, ref):
        x = tx.realize(b["self"])
        w = _lerp_weight(tx, b["weight"], x.example.dtype)
        if w is None:
            return None
        if inplace:
            return _op(tx, "call_method", "lerp_", x, b["end"], w)
        return _op(tx, "call_function", torch.lerp, x, b["end"], w)
    return emit


def _foreach_pow_scalar_base(tx, b, ref):
    """`_foreach_pow(s, exps)`: `pow(s, e)` for each e, s in the result dtype (the cast the
    wrapped Scalar gets inside `pow(Scalar, Tensor)`)."""
    exps = _tensors(tx, b["exponent"])
    if exps is None or len(ref) != len(exps):
        return None
    s = tx.realize(b["self"])
    if s.example.dtype.is_complex:
        return None
    out = []
    for e, r in zip(exps, ref):
        base = s if s.example.dtype == r.dtype else \
            _op(tx, "call_method", "to", s, ConstantVariable(value=r.dtype))
        out.append(_op(tx, "call_function", torch.pow, base, e))
    return _container(ref, out)


def _foreach_binary(fn: Any, method: str, inplace: bool):
    """`_foreach_add/sub(xs, s)`: `add/sub(x, s)` for each x (`add(Tensor, Scalar)` itself
    calls the Tensor overload with the Scalar wrapped in a 0-d tensor: the same kernel)."""
    def emit(tx, b, ref):
        selfs = _tensors(tx, b["self"])
        if selfs is None:
            return None
        s = tx.realize(b["scalar"])
        out = [_op(tx, "call_method", method + "_", x, s) if inplace
               else _op(tx, "call_function", fn, x, s) for x in selfs]
        return tx.realize(b["self"]) if inplace else _container(ref, out)
    return emit


def _pointwise3(fn: Any, method: str, inplace: bool, foreach: bool):
    """addcmul/addcdiv(self, t1, t2, value=s) as the op on (self, s * t1, t2)."""
    def one(tx, x, t1, t2, value):
        dt = x.example.dtype
        if dt not in _SAME_OPMATH or t1.example.dtype != dt or t2.example.dtype != dt:
            return None
        s = _as_dtype(tx, value, dt)
        if s is None:
            return None
        scaled = _op(tx, "call_function", torch.mul, s, t1)
        if inplace:
            return _op(tx, "call_method", method + "_", x, scaled, t2)
        return _op(tx, "call_function", fn, x, scaled, t2)

    def emit(tx, b, ref):
        from ferrodyn.variables.tensor import TensorVariable
        if not foreach:
            args = [tx.realize(b[k]) for k in ("self", "tensor1", "tensor2")]
            if not all(isinstance(a, TensorVariable) for a in args):
                return None
            return one(tx, *args, b["value"])
        lists = [_tensors(tx, b[k]) for k in ("self", "tensor1", "tensor2")]
        if any(v is None for v in lists) or len({len(v) for v in lists}) != 1:
            return None
        out = []
        for x, t1, t2 in zip(*lists):
            r = one(tx, x, t1, t2, b["value"])
            if r is None:
                return None
            out.append(r)
        return tx.realize(b["self"]) if inplace else _container(ref, out)
    return emit


@dataclass(frozen=True)
class ScalarTensorRewrite:
    """One overload: its parameters in order (keyword-only ones after `*`), the Scalar
    parameter a 0-d tensor may fill, and `emit(tx, bound, reference)` (None: refused)."""

    params: tuple[str, ...]
    scalar: str
    emit: Callable[..., VariableTracker | None]
    defaults: tuple[tuple[str, Any], ...] = ()

    def bind(self, args: list, kwargs: dict) -> dict | None:
        positional = [p for p in self.params if p != "*"]
        n_pos = self.params.index("*") if "*" in self.params else len(positional)
        if len(args) > n_pos or any(k not in positional for k in kwargs):
            return None
        bound = dict(zip(positional, args))
        for k, v in kwargs.items():
            if k in bound:
                return None
            bound[k] = v
        for k, v in self.defaults:
            bound.setdefault(k, ConstantVariable(value=v))
        return bound if all(p in bound for p in positional) else None


_M = "method"
_ADDC = ("self", "tensor1", "tensor2", "*", "value")


def _addc_rows(name: str, fn: Any) -> dict:
    fe, fe_ = getattr(torch, f"_foreach_{name}"), getattr(torch, f"_foreach_{name}_")
    return {
        fn: [ScalarTensorRewrite(_ADDC, "value", _pointwise3(fn, name, False, False))],
        (_M, name): [ScalarTensorRewrite(_ADDC[1:], "value", _pointwise3(fn, name, False, False))],
        (_M, name + "_"): [ScalarTensorRewrite(_ADDC[1:], "value",
                                               _pointwise3(fn, name, True, False))],
        fe: [ScalarTensorRewrite(_ADDC, "value", _pointwise3(fn, name, False, True))],
        fe_: [ScalarTensorRewrite(_ADDC, "value", _pointwise3(fn, name, True, True))],
    }


# (kind, target) keys: a torch callable for call_function, ("method", name) for call_method
SCALAR_TENSOR_REWRITES: dict[Any, list[ScalarTensorRewrite]] = {
    torch._foreach_lerp_: [ScalarTensorRewrite(("self", "tensors1", "weight"), "weight",
                                               _foreach_lerp(True))],
    torch._foreach_lerp: [ScalarTensorRewrite(("self", "tensors1", "weight"), "weight",
                                              _foreach_lerp(False))],
    torch.lerp: [ScalarTensorRewrite(("self", "end", "weight"), "weight", _lerp(False))],
    (_M, "lerp"): [ScalarTensorRewrite(("end", "weight"), "weight", _lerp(False))],
    (_M, "lerp_"): [ScalarTensorRewrite(("end", "weight"), "weight", _lerp(True))],
    torch._foreach_pow: [ScalarTensorRewrite(("self", "exponent"), "self",
                                             _foreach_pow_scalar_base)],
    **{getattr(torch, f"_foreach_{name}{suffix}"): [ScalarTensorRewrite(
        ("self", "scalar"), "scalar", _foreach_binary(getattr(torch, name), name, bool(suffix)))]
       for name in ("add", "sub") for suffix in ("", "_")},
    **_addc_rows("addcmul", torch.addcmul),
    **_addc_rows("addcdiv", torch.addcdiv),
}


def _key(kind: str, target: Any) -> Any:
    return (_M, target) if kind == "call_method" else target


def _reference(tx, kind, target, args, kwargs, scalar) -> Any:
    """The op run on fake tensors with the 0-d tensor as a Python number; None if it raises."""
    from ferrodyn.variables.tensor import fx_args
    value = _placeholder(scalar.example)
    args = [ConstantVariable(value=value) if tx.realize(a) is scalar else a for a in args]
    kwargs = {k: ConstantVariable(value=value) if tx.realize(v) is scalar else v
              for k, v in kwargs.items()}
    _, ea, _, ek = fx_args(tx, args, kwargs)

    def run():
        if kind == "call_method":
            return getattr(ea[0], target)(*ea[1:], **ek)
        return target(*ea, **ek)
    try:
        return tx.output.run_fake(run), ea, ek
    except Exception:
        return None


def _autograd_records(tx, args, kwargs) -> bool:
    if not torch.is_grad_enabled():
        return False
    from ferrodyn.variables.tensor import fx_args
    _, ea, _, ek = fx_args(tx, args, kwargs)
    found = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            found.append(v.requires_grad)
        elif isinstance(v, (list, tuple)):
            for i in v:
                walk(i)
    walk([ea, list(ek.values())])
    return any(found)


def _all_on_cpu(tx, args, kwargs) -> bool:
    """The rewrites are verified against the CPU kernels only: CUDA's fused foreach kernels
    associate differently (`self + value * (t1 * t2)`), so other devices keep the break."""
    from ferrodyn.variables.tensor import fx_args
    _, ea, _, ek = fx_args(tx, args, kwargs)
    devices = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            devices.append(v.device.type)
        elif isinstance(v, (list, tuple)):
            for i in v:
                walk(i)
    walk([ea, list(ek.values())])
    return all(d == "cpu" for d in devices)


def _same(tx, result: VariableTracker, ref: Any, inputs: list) -> bool:
    from ferrodyn.variables.tensor import TensorVariable
    result = tx.realize(result)
    for fake, var in inputs:  # the op returned one of its arguments (in-place ops)
        if ref is fake:
            return result is var
    if isinstance(ref, torch.Tensor):
        e = getattr(result, "example", None)
        return isinstance(result, TensorVariable) and isinstance(e, torch.Tensor) and \
            e.dtype == ref.dtype and e.shape == ref.shape and e.device == ref.device and \
            e.requires_grad == ref.requires_grad
    if isinstance(ref, (list, tuple)):
        if result.python_type() is not type(ref):
            return False
        try:
            items = result.unpack(tx)
        except Exception:
            return False
        return len(items) == len(ref) and all(_same(tx, r, f, []) for r, f in zip(items, ref))
    return result.is_python_constant() and result.as_python_constant() == ref


def rewrite_scalar_tensor_call(tx, kind: str, target: Any, args, kwargs) -> VariableTracker | None:
    """The call rewritten with its 0-d tensor Scalar as a tensor operand, or None (no row, or
    a row refused it: the caller breaks the graph as before)."""
    from ferrodyn.variables.tensor import TensorVariable
    if kind == "call_function" and \
            getattr(target, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor):
        kind, target = "call_method", target.__name__  # `torch.Tensor.addcmul_(x, ...)`
    rows = SCALAR_TENSOR_REWRITES.get(_key(kind, target))
    if not rows:
        return None
    args = [tx.realize(a) for a in args]
    kwargs = {k: tx.realize(v) for k, v in kwargs.items()}
    call_args = args[1:] if kind == "call_method" else args
    for row in rows:
        bound = row.bind(call_args, kwargs)
        if bound is None:
            continue
        if kind == "call_method":
            bound["self"] = args[0]
        scalar = bound.get(row.scalar)
        if not isinstance(scalar, TensorVariable) or scalar.example.dim() != 0:
            continue
        if scalar.example.requires_grad:  # no Number to eager's argument parser (TypeError)
            return None
        if _autograd_records(tx, args, kwargs) or not _all_on_cpu(tx, args, kwargs):
            return None
        reference = _reference(tx, kind, target, args, kwargs, scalar)
        if reference is None:
            return None
        ref, ea, ek = reference
        result = row.emit(tx, bound, ref)
        if result is None:
            return None
        inputs = [(e, a) for e, a in zip(ea, args)] + \
            [(ek[k], kwargs[k]) for k in ek]
        if not _same(tx, result, ref, inputs):
            unsupported(f"{getattr(target, '__name__', target)} with a 0-d tensor Scalar: the "
                        f"rewrite does not match the op's result", BreakReason.DATA_DEPENDENT)
        return result
    return None

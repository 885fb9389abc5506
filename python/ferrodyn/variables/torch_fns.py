"""torch.* and torch.nn.functional.* callables (functions, torch classes, ops).

Owns `TorchFunctionVariable` and its dispatch: a table of functions with trace-time meaning
(grad-mode queries, `torch.jit.is_scripting`, `has_torch_function`, `torch.Size`, context
managers...), a table of refused functions (RNG seeding, autograd entry points), and the
default: record the call as one `call_function` node, with fake execution deciding result
types (so `F.multi_head_attention_forward` or `F.batch_norm` are one node each). Torch's
Python functions are not inlined: their fake execution is the trace.
Does not own tensor methods (tensor.py) or grad/autocast contexts (ctx_managers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ferrodyn.exc import BreakReason, graph_break
from ferrodyn.variables.base import VariableTracker, raised_while_tracing, unsupported
from ferrodyn.variables.constant import ConstantVariable, fold, wrap_constant
from ferrodyn.variables.ctx_managers import CTX_MANAGER_HANDLERS
from ferrodyn.variables.tensor import TensorVariable, record_op
from ferrodyn.variables.profiler_ctx import PROFILER_HANDLERS
from ferrodyn.variables.state_ctx import STATE_CTX_HANDLERS
from ferrodyn.variables.tensor_ctor import handlers as tensor_ctor_handlers


def _c(v):
    return ConstantVariable(value=v)


def _fold_consts(tx, fn, args, kwargs):
    vals = [tx.realize(a) for a in args]
    kvals = {k: tx.realize(v) for k, v in kwargs.items()}
    if not all(v.is_python_constant() for v in [*vals, *kvals.values()]):
        unsupported(f"{fn.__name__} with non-constant arguments", BreakReason.UNSUPPORTED_CALL)
    return wrap_constant(fold(fn, *[v.as_python_constant() for v in vals],
                              **{k: v.as_python_constant() for k, v in kvals.items()}))


def _has_torch_function(tx, args, kwargs):
    def plain(v):
        v = tx.realize(v)
        if isinstance(v, TensorVariable):
            return v.cls in (torch.Tensor, torch.nn.Parameter)
        if v.is_python_constant():
            return True
        try:
            return all(plain(i) for i in v.unpack(tx))
        except Exception:
            return False
    if all(plain(a) for a in args):
        return _c(False)
    unsupported("has_torch_function on tensor subclasses", BreakReason.UNSUPPORTED_TYPE)


def _assert(tx, args, kwargs):
    cond = tx.realize(args[0])
    if cond.is_python_constant() and cond.as_python_constant():
        return _c(None)
    if isinstance(cond, TensorVariable):
        return record_op(tx, "call_function", torch._assert, args, kwargs)
    unsupported("torch._assert failed at trace time", BreakReason.EXCEPTION)


def _ctx_clone(tx, args, kwargs):
    """`ctx.clone()` of a grad-mode decorator instance (`@torch.no_grad()` wrappers call it to
    make a fresh context per call)."""
    from ferrodyn.variables.ctx_managers import GradModeVariable
    value = getattr(tx.realize(args[0]), "value", None)
    if type(value) is torch.no_grad:
        return GradModeVariable.create(tx, False)
    if type(value) is torch.enable_grad:
        return GradModeVariable.create(tx, True)
    if type(value) is torch.set_grad_enabled:
        return GradModeVariable.create(tx, bool(value.mode), eager_set=True)
    unsupported(f"clone of context manager {type(value).__name__}", BreakReason.UNSUPPORTED_CALL)


def _const_result(value):
    return lambda tx, args, kwargs: _c(value)


def _is_compiling(tx, args, kwargs):
    """`torch.compiler.is_compiling()`: True in the trace; noted, so a frame captured with no
    graph op that read it runs eagerly (convert_frame) instead of returning the folded True to
    eager callers."""
    tx.output.read_is_compiling = True
    return _c(True)


def _empty_dispatch_mode_stack(tx, args, kwargs):
    """`torch.utils._python_dispatch._get_current_dispatch_mode_stack()`: a fresh empty list, as
    torch.compile models it (its trace runs with the dispatch modes removed);
    nn.MultiheadAttention asks it before its fast path."""
    if args or kwargs:
        unsupported("_get_current_dispatch_mode_stack() with arguments", BreakReason.UNSUPPORTED_CALL)
    from ferrodyn.variables.lists import ListVariable
    return ListVariable.new([])


def _fold(fn):
    return lambda tx, args, kwargs: _fold_consts(tx, fn, args, kwargs)


def _refuse(reason: BreakReason):
    def handler(tx, args, kwargs):
        unsupported("this torch function", reason)
    return handler


TORCH_HANDLERS: dict[Any, Callable] = {
    **CTX_MANAGER_HANDLERS,
    **PROFILER_HANDLERS,
    **STATE_CTX_HANDLERS,
    **tensor_ctor_handlers(),  # torch.tensor of traced values, torch._shape_as_tensor
    torch.is_grad_enabled: _fold(torch.is_grad_enabled),
    torch.is_autocast_enabled: _fold(torch.is_autocast_enabled),
    torch.get_default_dtype: _fold(torch.get_default_dtype),
    torch.is_inference_mode_enabled: _fold(torch.is_inference_mode_enabled),
    torch.overrides.has_torch_function: _has_torch_function,
    torch.overrides.has_torch_function_unary: _has_torch_function,
    torch.overrides.has_torch_function_variadic: _has_torch_function,
    torch._C._has_torch_function: _has_torch_function,
    torch._C._has_torch_function_unary: _has_torch_function,
    torch._C._has_torch_function_variadic: _has_torch_function,
    torch.jit.is_scripting: _const_result(False),
    torch.jit.is_tracing: _const_result(False),
    torch.jit.annotate: lambda tx, args, kwargs: (list(args) + list(kwargs.values()))[1],
    torch._C._get_tracing_state: _const_result(None),
    torch.compiler.is_compiling: _is_compiling,
    torch.compiler.is_dynamo_compiling: _is_compiling,
    torch._assert: _assert,
    torch.utils._python_dispatch._get_current_dispatch_mode_stack: _empty_dispatch_mode_stack,
    torch.utils._contextlib._DecoratorContextManager.clone: _ctx_clone,
    torch.set_grad_enabled.clone: _ctx_clone,
    torch.Size: _fold(torch.Size),
    torch.device: _fold(torch.device),
    torch.finfo: _fold(torch.finfo),
    torch.iinfo: _fold(torch.iinfo),
    torch.manual_seed: _refuse(BreakReason.SIDE_EFFECT),
    torch.seed: _refuse(BreakReason.SIDE_EFFECT),
    torch.set_rng_state: _refuse(BreakReason.SIDE_EFFECT),
    torch.get_rng_state: _refuse(BreakReason.SIDE_EFFECT),
    torch.autograd.grad: _refuse(BreakReason.UNSUPPORTED_CALL),
    torch.autograd.backward: _refuse(BreakReason.UNSUPPORTED_CALL),
    torch.nn.Parameter: _refuse(BreakReason.UNSUPPORTED_CALL),
    torch.set_default_dtype: _refuse(BreakReason.SIDE_EFFECT),
    torch.use_deterministic_algorithms: _refuse(BreakReason.SIDE_EFFECT),
    # reads the profiler's global state, which no guard covers: folding it would bake a stale
    # answer into the cache entry
    torch.autograd._profiler_enabled: _refuse(BreakReason.UNSUPPORTED_CALL),
}
TORCH_HANDLERS[graph_break] = _refuse(BreakReason.GRAPH_BREAK)


def _from_numpy(tx, args, kwargs):
    from ferrodyn.variables.numpy_vars import torch_from_numpy
    return torch_from_numpy(tx, args, kwargs)


TORCH_HANDLERS[torch.from_numpy] = _from_numpy


def _higher_order_handlers() -> dict:  # checkpoint, cond: traced bodies (higher_order_ops.py)
    from ferrodyn.variables.higher_order_ops import HIGHER_ORDER_HANDLERS
    return HIGHER_ORDER_HANDLERS


TORCH_HANDLERS.update(_higher_order_handlers())
if hasattr(torch, "_dynamo") and hasattr(torch._dynamo, "graph_break"):
    TORCH_HANDLERS[torch._dynamo.graph_break] = _refuse(BreakReason.GRAPH_BREAK)
for _name in ("is_dynamo_compiling", "is_compiling"):
    _f = getattr(torch._dynamo, _name, None) if hasattr(torch, "_dynamo") else None
    if _f is not None:
        TORCH_HANDLERS[_f] = _is_compiling


def is_torch_callable(value: Any) -> bool:
    if value in TORCH_HANDLERS:
        return True
    if isinstance(value, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        return True
    mod = getattr(value, "__module__", None)
    if not isinstance(mod, str):
        return False
    return mod == "torch" or mod.startswith("torch.")


@dataclass(frozen=True, eq=False)
class TorchFunctionVariable(VariableTracker):
    fn: Any = None

    def as_python_constant(self):
        return self.fn

    def python_type(self):
        return type(self.fn)

    def identity(self):
        return ("obj", id(self.fn))

    def describe(self):
        return f"torch function {getattr(self.fn, '__qualname__', self.fn)}"

    def call_function(self, tx, args, kwargs):
        handler = TORCH_HANDLERS.get(self.fn)
        if handler is not None:
            return handler(tx, list(args), dict(kwargs))
        if isinstance(self.fn, type) and issubclass(self.fn, torch.nn.Module):
            unsupported(f"creating {self.fn.__name__} inside the traced code",
                        BreakReason.UNSUPPORTED_CALL)
        return record_op(tx, "call_function", self.fn, args, kwargs)

    def var_getattr(self, tx, name):
        try:
            value = getattr(self.fn, name)
        except AttributeError as e:
            raised_while_tracing(str(e))
        from ferrodyn.variables.builder import build_unsourced
        return build_unsourced(value)

    def has_attr(self, tx, name):
        return hasattr(self.fn, name)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        return OutConst(self.fn)

"""Which torch callables may be folded into a constant when no traced value reaches them.

`record_op` (tensor.py) runs a torch callable on fake values at trace time; a result that is a
Python constant is baked into the trace. When a tensor or symbolic int is among the arguments,
the constant is derived from what the guards check (dtype, shape, device, ...). When none is,
the result depends on the constant arguments and on whatever process state the callable reads
(`torch.get_num_threads()`, `torch.is_anomaly_enabled()`, `torch.get_float32_matmul_precision()`
...): baked without a guard, a later change of that state would leave the cache entry returning
the stale answer. Such a call is folded only when the callable is known to read nothing else
than its arguments, process constants (what the build or the machine has), or state that the
GLOBAL_STATE guard checks before every entry (grad mode, default dtype, deterministic
algorithms, autocast enabled and dtype per device type); any other one is refused (the graph
breaks at it and the call runs eagerly).

Owns `folds_without_inputs(target)`. Does not own running the call (tensor.py), the torch
functions with handlers of their own (torch_fns.py), or what GLOBAL_STATE reads (Rust guards).
"""
from __future__ import annotations

from typing import Any

import torch


def _existing(*paths: str) -> set:
    found = set()
    for path in paths:
        obj: Any = torch
        for part in path.split(".")[1:]:
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            found.add(obj)
    return found


# Functions of their arguments only.
_PURE = (
    "torch.promote_types", "torch.can_cast", "torch.result_type", "torch.broadcast_shapes",
    "torch.is_tensor", "torch.is_storage", "torch.is_complex", "torch.is_floating_point",
    "torch.is_nonzero", "torch._utils._get_device_index",
    "torch.nn.functional._Reduction.get_enum", "torch.nn.functional._Reduction.legacy_get_enum",
    "torch.nn.functional._Reduction.legacy_get_string",
    "torch.nn.modules.utils._single", "torch.nn.modules.utils._pair",
    "torch.nn.modules.utils._triple", "torch.nn.modules.utils._quadruple",
)
# What the build or the machine has: constant for the life of the process.
_PROCESS = (
    "torch._C._get_privateuse1_backend_name", "torch.cuda.is_available",
    "torch.cuda.device_count", "torch.cuda.get_device_capability",
    "torch.cuda.get_device_properties", "torch.cuda.is_bf16_supported",
    "torch.backends.mps.is_available", "torch.backends.mps.is_built",
    "torch.backends.cuda.is_built", "torch.backends.cudnn.is_available",
    "torch.backends.mkldnn.is_available", "torch.backends.openmp.is_available",
    "torch.distributed.is_available", "torch.xpu.is_available", "torch.mps.is_available",
)
# State the GLOBAL_STATE guard checks on every entry.
_GUARDED = (
    "torch.is_grad_enabled", "torch._C.is_grad_enabled", "torch.get_default_dtype",
    "torch.are_deterministic_algorithms_enabled", "torch.is_autocast_enabled",
    "torch.is_autocast_cpu_enabled", "torch.get_autocast_dtype", "torch.get_autocast_gpu_dtype",
    "torch.get_autocast_cpu_dtype", "torch._C._is_any_autocast_enabled",
)
# Constant while ferrodyn traces (it never runs under torch.export's trace).
_TRACE_CONSTANT = ("torch.compiler.is_exporting",)
# Known gap: state no guard checks yet, folded as before because real model code reads it on
# every call (nn.MultiheadAttention: the fast-path switch, which picks between two kernels of
# the same function; torch-function dispatch enabled, which the traced `with` blocks of
# state_ctx.py model inside the frame but which no guard checks at the entry).
_UNGUARDED = ("torch.backends.mha.get_fastpath_enabled", "torch._C._is_torch_function_enabled")
_FOLDABLE = frozenset(_existing(*_PURE, *_PROCESS, *_GUARDED, *_TRACE_CONSTANT, *_UNGUARDED))


def folds_without_inputs(target: Any) -> bool:
    """Whether `target(*constants)` may be baked into the trace as its result (docstring)."""
    try:
        return target in _FOLDABLE
    except TypeError:  # an unhashable callable
        return False

"""Lazy modules (`torch.nn.modules.lazy.LazyModuleMixin`) called from traced code before their
parameters exist.

Eagerly, the first call of a lazy module runs its `_infer_parameters` forward pre-hook, which
calls `initialize_parameters(*args, **kwargs)`, removes the hook and (with `cls_to_become`)
changes the module's class; `forward` then runs on the materialized module. Tracing that hook
is not possible (materializing an `UninitializedParameter` swaps a tensor's class and storage),
so — as TorchDynamo does — `initialize_lazy_module` runs `_infer_parameters` for real at trace
time, then restarts the trace (`RestartAnalysis`) so that every tracker and guard is built
from the initialized module (its new class, its parameters, its hook dicts).

Owns only that decision and its refusals. Values must be exactly eager's, so it refuses unless:
- the module's pre-hooks are that one initialization hook (another pre-hook would run first);
- the initialization draws random numbers at the point eager would: nothing in the graph
  captured so far draws (that graph runs only after the trace);
- each argument is something eager would pass: a frame tensor (a graph input, real value, no
  in-place op in the graph so far), a constant, or a list/tuple/namedtuple/dict of those. A
  tensor computed in the graph has only a fake value: it is accepted only by torch's own lazy
  modules, whose `initialize_parameters` reads nothing but static shapes.
Does not own module calls (module_hooks.py) or attribute lookup (nn_module.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.lazy import LazyModuleMixin

from ferrodyn.exc import BreakReason, RestartAnalysis
from ferrodyn.variables.base import VariableTracker, unsupported


class _Refused(Exception):
    pass


def needs_initialization(m: Any) -> bool:
    return isinstance(m, LazyModuleMixin) and hasattr(m, "_initialize_hook")


def _torch_owned(m: Any) -> bool:
    """`initialize_parameters` is one of torch.nn's own (shape-only) implementations."""
    fn = getattr(type(m), "initialize_parameters", None)
    return getattr(fn, "__module__", "").startswith("torch.nn.")


class _ArgConverter:
    """The Python value eager would hand `initialize_parameters` for each argument tracker."""

    def __init__(self, tx, allow_fake: bool):
        self.tx = tx
        self.allow_fake = allow_fake

    def __call__(self, v: VariableTracker) -> Any:
        from ferrodyn.symbolic_shapes import is_symbolic
        from ferrodyn.variables.dicts import DictVariable
        from ferrodyn.variables.lists import ListVariable, TupleVariable
        from ferrodyn.variables.namedtuple_vars import NamedTupleVariable
        from ferrodyn.variables.tensor import TensorVariable
        tx = self.tx
        v = tx.realize(v)
        if isinstance(v, TensorVariable):
            node = v.node
            real = _real_input(tx.output, node)
            if isinstance(real, torch.Tensor) and tx.output.mutation_epoch == 0:
                return real
            ex = v.example
            if not self.allow_fake or not isinstance(ex, torch.Tensor) or \
                    any(is_symbolic(s) for s in ex.shape):
                raise _Refused(f"a tensor computed in the graph ({v.describe()})")
            return ex
        if isinstance(v, NamedTupleVariable):
            items = [self(i) for i in v.unpack(tx)]
            return v.cls(*items) if not v.structseq else v.cls(items)
        if isinstance(v, (TupleVariable, ListVariable)):
            items = [self(i) for i in v.unpack(tx)]
            return tuple(items) if isinstance(v, TupleVariable) else items
        if isinstance(v, DictVariable) and v.state.cls is dict:
            return {k: self(i) for k, i in v.state.items.items()}
        if v.is_python_constant():
            return v.as_python_constant()
        raise _Refused(v.describe())


def _real_input(output, node) -> Any:
    """The frame's value of graph input `node` (None for any other node)."""
    if node is None or node.op != "placeholder":
        return None
    for n, value in zip(output._placeholders, output.example_inputs):
        if n is node:
            return value
    return None


def initialize_lazy_module(tx, mod, args: list, kwargs: dict) -> None:
    """Initialize lazy module tracker `mod`'s module as its first call would, then restart the
    trace; refused (a graph break at the call) where eager's values cannot be reproduced."""
    from ferrodyn.variables.higher_order_ops import _draws_random
    m = mod.value
    name = type(m).__name__
    pre = m.__dict__.get("_forward_pre_hooks") or {}
    if list(pre) != [m._initialize_hook.id] or \
            type(m)._infer_parameters is not LazyModuleMixin._infer_parameters:
        unsupported(f"lazy module {name} with other forward pre-hooks (or its own "
                    "_infer_parameters)", BreakReason.UNSUPPORTED_CALL)
    if _draws_random(_GraphView(tx.output)):
        unsupported(f"initializing lazy module {name} after random ops in the same graph "
                    "(eager draws its initial values later)", BreakReason.UNSUPPORTED_CALL)
    convert = _ArgConverter(tx, allow_fake=_torch_owned(m))
    try:
        real_args = tuple(convert(a) for a in args)
        real_kwargs = {k: convert(v) for k, v in kwargs.items()}
    except _Refused as e:
        unsupported(f"initializing lazy module {name} with {e} (its initialize_parameters "
                    "may read values)", BreakReason.UNSUPPORTED_CALL)
    m._infer_parameters(m, real_args, real_kwargs)
    raise RestartAnalysis(f"lazy module {name} initialized")


class _GraphView:
    """What `_draws_random` reads of a GraphModule: the graph being built and the bodies of
    its higher-order ops."""

    def __init__(self, output):
        self.graph = output.graph
        self._subgraphs = list(output.subgraphs.values())

    def children(self):
        return iter(self._subgraphs)


__all__ = ["needs_initialization", "initialize_lazy_module"]

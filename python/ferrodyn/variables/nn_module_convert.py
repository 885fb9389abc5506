"""`module.to(...)`, `.float()`, `.double()`, `.half()`, `.bfloat16()`, `.cpu()` called inside
the traced frame, modelled where they change nothing.

Eagerly each is `Module._apply(fn)`: for every module of the tree, every parameter gets
`param.data = fn(param)` (and its `.grad` likewise), every buffer `_buffers[k] = fn(buf)`, and
the module is returned. When `fn(t)` returns `t` itself for every one of those tensors (already
of that dtype and on that device, which their TENSOR_MATCH guards keep true), that is a no-op
and the call is the module itself, as long as no module of the tree overrides `_apply` (RNNs
rebuild their flat weights there) and torch's two conversion switches in `torch.__future__` are
off (`overwrite_module_params_on_conversion` makes new Parameter objects, `swap_..._on_conversion`
swaps them: both guarded, read through torch.nn.modules.module's namespace). A conversion that
would change a tensor is refused (the call runs eagerly at a graph break), as are `.to()`
arguments that are not constants, `memory_format`, and dtypes that eager rejects or warns
about. Owns `CONVERSIONS` (the handlers, by method name, used by nn_module's tree-method
table). Does not own module attribute lookup (nn_module.py) or tensor conversions in graphs.
"""

from __future__ import annotations

from typing import Callable

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import NotConstant, VariableTracker, unsupported

# (device, dtype) a conversion asks for; None: left as is
Target = tuple[torch.device | None, torch.dtype | None]


def _constants(tx, what: str, args, kwargs) -> tuple[list, dict]:
    try:
        pos = [tx.realize(a).as_python_constant() for a in args]
        kw = {k: tx.realize(v).as_python_constant() for k, v in kwargs.items()}
    except NotConstant:
        unsupported(f"nn.Module.{what}() with an argument that is not a constant",
                    BreakReason.UNSUPPORTED_CALL)
    return pos, kw


def _to_target(tx, args, kwargs) -> Target:
    """`Module.to`'s arguments, parsed by torch's own `_parse_to`."""
    pos, kw = _constants(tx, "to", args, kwargs)
    if any(isinstance(v, torch.Tensor) for v in (*pos, *kw.values())):
        unsupported("nn.Module.to(tensor) inside the traced code", BreakReason.UNSUPPORTED_CALL)
    try:
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*pos, **kw)
    except Exception as e:  # eager raises it: the call runs eagerly and does
        unsupported(f"nn.Module.to(...) raised {type(e).__name__}: {e}", BreakReason.EXCEPTION)
    if memory_format is not None:
        unsupported("nn.Module.to(memory_format=...) inside the traced code",
                    BreakReason.UNSUPPORTED_CALL)
    if dtype is not None and not dtype.is_floating_point:
        # eager raises TypeError for integer dtypes and warns for complex ones
        unsupported(f"nn.Module.to({dtype}) (eager raises or warns)", BreakReason.UNSUPPORTED_CALL)
    return device, dtype


def _fixed(dtype: torch.dtype | None = None, device: str | None = None):
    def parse(tx, args, kwargs) -> Target:
        if args or kwargs:
            unsupported("nn.Module conversion method with arguments", BreakReason.UNSUPPORTED_CALL)
        return (torch.device(device) if device else None), dtype
    return parse


def _unchanged(t: torch.Tensor, target: Target) -> bool:
    """Whether `fn(t)` of `_apply` returns `t` itself: `to` converts only floating and complex
    tensors' dtype (`float()` & co. only floating ones: the same for the floating dtypes
    accepted here); a device must name the tensor's own (cuda without an index is refused)."""
    device, dtype = target
    if dtype is not None and (t.is_floating_point() or t.is_complex()) and t.dtype != dtype:
        return False
    if device is not None:
        if device.type != "cpu" and device.index is None:
            return False
        if t.device != device:
            return False
    return True


def _future_switches_off(tx, mod) -> None:
    """Guard `torch.__future__`'s two conversion switches off (read through
    torch.nn.modules.module's namespace, where `_apply` reads them); refused when on or
    unreachable."""
    from ferrodyn.source import AttrSource, ItemSource
    from ferrodyn.variables.builder import build
    from ferrodyn.variables.module_hooks import _globals_source
    fut = torch.__future__
    switches = ("_overwrite_module_params_on_conversion", "_swap_module_params_on_conversion")
    if any(getattr(fut, s, False) for s in switches):
        unsupported("nn.Module conversion with torch.__future__ conversion switches on",
                    BreakReason.UNSUPPORTED_CALL)
    src = _globals_source(tx, mod)
    if src is None or not all(hasattr(fut, s) for s in switches):
        unsupported("nn.Module conversion: torch.__future__ cannot be guarded from this frame",
                    BreakReason.UNSUPPORTED_CALL)
    fut_src = AttrSource(ItemSource(src, "torch"), "__future__")
    for s in switches:
        build(tx, getattr(fut, s), AttrSource(fut_src, s))


def _tensors(tx, mod) -> list:
    """(tracker, is_parameter) of every parameter and buffer of every module of the tree (as the
    trace sees them), refused where `_apply` is overridden."""
    from ferrodyn.variables.nn_module import _module_tree
    out = []
    for _, m in _module_tree(tx, mod, "", True):
        if getattr(type(m.value), "_apply", None) is not torch.nn.Module._apply:
            unsupported(f"nn.Module conversion of a tree holding {type(m.value).__name__} (its own "
                        f"_apply)", BreakReason.UNSUPPORTED_CALL)
        for dict_name in ("_parameters", "_buffers"):
            out += [(v, dict_name == "_parameters") for _, v in m._children(tx, dict_name)]
    return out


def _grad(tx, var) -> VariableTracker | None:
    """The `.grad` of parameter tracker `var` (guarded through its Source), None when None."""
    from ferrodyn.source import AttrSource
    from ferrodyn.variables.builder import build
    real = tx.output.side_effects.tracked_object(var)
    if var.source is None or real is None:
        unsupported("nn.Module conversion of a parameter made in the frame",
                    BreakReason.UNSUPPORTED_CALL)
    g = tx.realize(build(tx, real[0].grad, AttrSource(var.source, "grad")))
    return None if g.is_python_constant() and g.as_python_constant() is None else g


def _conversion(parse: Callable[..., Target], what: str):
    def handler(tx, mod, *args, **kwargs):
        from ferrodyn.variables.tensor import TensorVariable
        target = parse(tx, args, kwargs)
        _future_switches_off(tx, mod)
        for var, is_param in _tensors(tx, mod):
            var = tx.realize(var)
            tensors = [var]
            if is_param and isinstance(var, TensorVariable):
                g = _grad(tx, var)
                tensors += [g] if g is not None else []
            for t in tensors:
                if not isinstance(t, TensorVariable):
                    unsupported(f"nn.Module.{what}() over {t.describe()}",
                                BreakReason.UNSUPPORTED_CALL)
                if not _unchanged(t.example, target):
                    unsupported(f"nn.Module.{what}() converting a parameter or buffer inside the "
                                f"traced code (not modelled)", BreakReason.UNSUPPORTED_CALL)
        return mod
    return handler


CONVERSIONS: dict[str, Callable] = {
    "to": _conversion(_to_target, "to"),
    "float": _conversion(_fixed(torch.float32), "float"),
    "double": _conversion(_fixed(torch.float64), "double"),
    "half": _conversion(_fixed(torch.float16), "half"),
    "bfloat16": _conversion(_fixed(torch.bfloat16), "bfloat16"),
    "cpu": _conversion(_fixed(device="cpu"), "cpu"),
}

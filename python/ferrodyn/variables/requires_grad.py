"""`Tensor.requires_grad_()` on a tensor the frame made, captured as torch.compile does.

`x.requires_grad_(flag)` when `x.requires_grad` already equals `flag` changes nothing: the
call returns `x` and records no op (eager's call is a no-op too). Turning requires_grad on for
a tensor made by the graph (no Source: not an input, a parameter or anything reachable from
outside the frame; a plain `torch.Tensor`; not sharing storage with a graph input) makes it a
new autograd leaf, an effect local to the graph: the node `x.requires_grad_()` is recorded
between `torch._C._functorch.set_inplace_requires_grad_allowed(True)` and a switch back to
the previous setting (so aot backends, which re-trace the graph under functorch transforms,
may replay it), the fake example becomes a leaf that requires grad (so later ops, and reads of
`requires_grad`, see what eager sees), and the node is remembered as a *leaf of the graph*.

aot backends' functionalization drops the effect on graph outputs. So, as torch.compile does,
`check_leaks` (called by `OutputGraph.build_result` once the outputs are known) refuses a
graph where an output that requires grad depends on such a leaf (through any chain of graph
ops): the capture raises Unsupported whose break path is the `requires_grad_` call itself, so
the frame is traced again and the graph breaks at that call (the call then runs eagerly and
the rest of the frame resumes with the leaf as an input). Found while capturing a later graph
break (the leaf live across it), the same call is named as `reroute_path`: trace_frame breaks
there instead. Refused outright (the graph breaks at
the call): turning requires_grad off (eager raises for a non-leaf), a graph input or anything
with a Source, a tensor subclass, a view of a graph input, and a call inside a higher-order op
body or a custom Function's speculation (their graphs are not the frame's).

Owns `requires_grad_` (the tensor-method handler) and `check_leaks`. Does not own other tensor
methods (tensor.py) or the graph's outputs (output_graph.py).
"""

from __future__ import annotations

import torch
import torch.fx

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.variables.base import VariableTracker, unsupported

_ALLOW = torch._C._functorch.set_inplace_requires_grad_allowed
_ALLOWED = torch._C._functorch.get_inplace_requires_grad_allowed


def _flag(tx, args, kwargs) -> bool:
    if len(args) > 1 or set(kwargs) - {"requires_grad"} or (args and kwargs):
        unsupported("Tensor.requires_grad_() with unexpected arguments", BreakReason.EXCEPTION)
    given = args[0] if args else kwargs.get("requires_grad")
    if given is None:
        return True
    given = tx.realize(given)
    if not given.is_python_constant():
        unsupported("Tensor.requires_grad_() with a flag that is not a constant",
                    BreakReason.SIDE_EFFECT)
    return bool(given.as_python_constant())


def _aliases_input(tx, example: torch.Tensor) -> bool:
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(example.untyped_storage()) in tx.output._input_storages()


def _break_path(tx) -> list:
    """The (translator, instruction index, visit) path to the current call, root first."""
    path = []
    t = tx
    while t is not None:
        index = t.ip - 1
        path.insert(0, (t, index, t.visits.get(index, 1)))
        t = t.parent
    return path


def requires_grad_(tx, tensor, args, kwargs) -> VariableTracker:
    from ferrodyn.output_graph import OutputGraph
    want = _flag(tx, args, kwargs)
    example = tensor.example
    if example.requires_grad == want:
        return tensor
    what = "Tensor.requires_grad_()"
    if not want:
        unsupported(f"{what} turning requires_grad off", BreakReason.SIDE_EFFECT)
    if tensor.source is not None:
        unsupported(f"{what} of {tensor.source.name()} (mutation of state outside the frame)",
                    BreakReason.SIDE_EFFECT)
    if type(tx.output) is not OutputGraph:
        unsupported(f"{what} inside a higher-order op body or a custom Function",
                    BreakReason.SIDE_EFFECT)
    if tensor.cls is not torch.Tensor or type(example) is torch.nn.Parameter:
        unsupported(f"{what} of a tensor subclass", BreakReason.SIDE_EFFECT)
    if _aliases_input(tx, example):
        unsupported(f"{what} of a view of a graph input", BreakReason.SIDE_EFFECT)
    out = tx.output
    prev = _ALLOWED()
    out.create_node("call_function", _ALLOW, (True,), {})
    node = out.create_node("call_method", "requires_grad_", (tensor.node,), {})
    node.meta["example_value"] = example
    out.create_node("call_function", _ALLOW, (prev,), {})
    _ALLOW(True)
    try:
        example.requires_grad_(True)
    finally:
        _ALLOW(prev)
    out.requires_grad_leaves.append((tensor.node, _break_path(tx)))
    return tensor


def check_leaks(output, outputs: list[torch.fx.Node]) -> None:
    """Refuse the graph when an output requiring grad depends on a leaf made by
    `requires_grad_` (aot backends would drop the leaf's effect); the break is at that leaf's
    `requires_grad_` call."""
    leaves = output.requires_grad_leaves
    if not leaves:
        return
    origin = {node: path for node, path in leaves}
    taint: dict[torch.fx.Node, torch.fx.Node] = {node: node for node in origin}
    for n in output.graph.nodes:
        if n in taint:
            continue
        for inp in n.all_input_nodes:
            if inp in taint:
                taint[n] = taint[inp]
                break
    for n in outputs:
        example = n.meta.get("example_value")
        if n in taint and isinstance(example, torch.Tensor) and example.requires_grad:
            e = Unsupported("Tensor.requires_grad_() of a tensor made in the frame that (or whose "
                            "result) leaves the graph requiring grad", BreakReason.SIDE_EFFECT)
            e.__dict__["break_path"] = list(origin[taint[n]])
            e.__dict__["reroute_path"] = list(origin[taint[n]])  # found capturing a break
            raise e

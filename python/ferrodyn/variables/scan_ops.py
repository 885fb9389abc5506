"""`torch._higher_order_ops.associative_scan.associative_scan(combine_fn, xs, dim,
reverse=False, combine_mode="pointwise")`, captured as torch.compile captures it.

The frontend's own steps are recorded as ops: each leaf of `xs` (a tensor, or a tuple/list of
tensors) is moved so the scan runs over dim 0 (`torch.movedim`), flipped when `reverse`, and
moved back (and flipped back) after the scan. `combine_fn(left, right)` (left and right shaped
like `xs`) is speculated (higher_order.py) over fresh stand-ins of one slice of each leaf; its
result must be shaped like `xs` with each leaf's slice metadata (torch checks the same), and,
run through make_fx on fake tensors, every aten op of its body must be pointwise.

- combine_mode="pointwise": the node is `torch.ops.higher_order.associative_scan(get_attr
  associative_scan_combine_fn_<n>, [leaves], (lifted...))` with the body installed on the graph
  (the node torch emits; its example value is the op run on fake tensors). torch refuses a body
  whose ops are not pointwise (views used only by pointwise ops pass, as in torch's check).
- combine_mode="generic": torch.compile records the frontend's decomposition (the recursive
  odd/even scan of `generic_associative_scan` over `aten.slice`s, `cat`, `pad`, `stack`,
  `flatten`), calling `torch.vmap(combine_fn)` on the slices. The same decomposition is recorded
  here with the body's ops replayed on the sliced batches directly (each op recorded again with
  its real operands), which equals the vmapped call when every aten op of the body is pointwise
  (no view, no reduction, no factory), every leaf has the same slice shape, each lifted tensor
  has at most the slice's rank, and, for 0-d slices beside lifted tensors, all share one dtype
  (so broadcasting and type promotion cannot tell a batch from one element). torch's graph holds
  the vmap's nesting ops around each call; this one holds the body's ops alone. Else refused.

Refused (the call graph-breaks; it then runs eagerly): keyword or argument shapes the frontend
does not take, nested pytrees, non-constant `dim` / `reverse` / `combine_mode`, symbolic sizes
(the decomposition reads them), and whatever the speculation refuses.

Owns `SCAN_HANDLERS` (merged into higher_order_ops.HIGHER_ORDER_HANDLERS). Does not own the
speculation (higher_order.py) or recording ops (tensor.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx
from torch._higher_order_ops.associative_scan import associative_scan as _frontend

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.higher_order import fresh_fake, install_subgraph, speculate_subgraph
from ferrodyn.variables.lists import ListVariable, TupleVariable
from ferrodyn.variables.tensor import TensorVariable, record_op

_OP = torch.ops.higher_order.associative_scan
_SLICE = torch.ops.aten.slice
_PARAMS = ("combine_fn", "xs", "dim", "reverse", "combine_mode")
_WHAT = "torch._higher_order_ops.associative_scan"


def _c(v) -> ConstantVariable:
    return ConstantVariable(value=v)


def _consts(values) -> ListVariable:
    return ListVariable.new([_c(v) for v in values])


def _op(tx, target, *args, **kwargs):
    return record_op(tx, "call_function", target, list(args), kwargs)


def _bind(tx, args, kwargs) -> dict:
    bound = dict(zip(_PARAMS, args))
    for k, v in kwargs.items():
        if k not in _PARAMS or k in bound:
            unsupported(f"{_WHAT} with argument {k!r}", BreakReason.UNSUPPORTED_CALL)
        bound[k] = v
    if len(args) > len(_PARAMS) or any(p not in bound for p in _PARAMS[:3]):
        unsupported(f"{_WHAT} with unexpected arguments", BreakReason.UNSUPPORTED_CALL)
    out = {"combine_fn": tx.realize(bound["combine_fn"]), "xs": tx.realize(bound["xs"])}
    for name, default in (("dim", None), ("reverse", False), ("combine_mode", "pointwise")):
        v = tx.realize(bound[name]) if name in bound else _c(default)
        if not v.is_python_constant():
            unsupported(f"{_WHAT} with a {name} that is not a constant",
                        BreakReason.UNSUPPORTED_CALL)
        out[name] = v.as_python_constant()
    if type(out["dim"]) is not int or type(out["reverse"]) is not bool or \
            out["combine_mode"] not in ("pointwise", "generic"):
        unsupported(f"{_WHAT} with invalid dim/reverse/combine_mode (eager raises)",
                    BreakReason.UNSUPPORTED_CALL)
    return out


def _leaves(tx, xs) -> tuple[list[TensorVariable], Callable[[list], Any]]:
    """The tensors of `xs` and how to rebuild its structure around new trackers."""
    if isinstance(xs, TensorVariable):
        return [xs], lambda items: items[0]
    if type(xs) in (TupleVariable, ListVariable):
        items = [tx.realize(i) for i in xs.unpack(tx)]
        if items and all(isinstance(i, TensorVariable) for i in items):
            if type(xs) is TupleVariable:
                return items, lambda new: TupleVariable(items=tuple(new))
            return items, lambda new: ListVariable.new(list(new))
    unsupported(f"{_WHAT} over {xs.describe()} (a tensor or a flat tuple/list of tensors)",
                BreakReason.UNSUPPORTED_TYPE)


def _same_meta(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _aten_graph(body, stand: list, lifted: list[torch.fx.Node], tx) -> torch.fx.GraphModule:
    from torch._higher_order_ops.utils import _maybe_fake_tracing
    inputs = [*stand, *(n.meta["example_value"] for n in lifted)]
    try:
        with tx.output.fake_mode:
            inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
        return _maybe_fake_tracing(body.module, inputs, pre_dispatch=False)
    except Unsupported:
        raise
    except Exception as e:
        unsupported(f"{_WHAT}: the combine_fn body cannot be traced to aten ops "
                    f"({type(e).__name__}: {e})", BreakReason.UNSUPPORTED_CALL)


def _strictly_pointwise(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) or \
                torch.Tag.pointwise not in n.target.tags:
            return False
    return True


def _pointwise_uses(gm: torch.fx.GraphModule) -> bool:
    from torch._inductor.utils import is_pointwise_use
    return all(all(is_pointwise_use(u) or u.op == "output" for u in n.users)
               for n in gm.graph.nodes)


def _associative_scan(tx, args, kwargs):
    b = _bind(tx, list(args), dict(kwargs))
    leaves, rebuild = _leaves(tx, b["xs"])
    examples = [x.example for x in leaves]
    if any(not all(type(s) is int for s in e.shape) for e in examples):
        unsupported(f"{_WHAT} over tensors of symbolic sizes", BreakReason.UNSUPPORTED_CALL)
    ndim = examples[0].dim()
    dim, mode = b["dim"], b["combine_mode"]
    if not -ndim <= dim < max(ndim, 1) or any(e.dim() <= dim % max(ndim, 1) for e in examples):
        unsupported(f"{_WHAT} with dim {dim} out of range (eager raises)",
                    BreakReason.UNSUPPORTED_CALL)
    if any(e.is_sparse for e in examples):
        unsupported(f"{_WHAT} over sparse tensors", BreakReason.UNSUPPORTED_TYPE)
    dim %= ndim
    n = len(leaves)
    moved = [_op(tx, torch.movedim, x, _c(dim), _c(0)) for x in leaves]
    if b["reverse"]:
        moved = [_op(tx, torch.flip, x, _consts([0])) for x in moved]
    stand = [fresh_fake(tx, tx.output.run_fake(lambda x=x: x.example[0])) for x in moved]
    stand = stand + [fresh_fake(tx, s) for s in stand]

    def pack(own):
        return [rebuild(own[:n]), rebuild(own[n:])]

    body = speculate_subgraph(tx, b["combine_fn"], [], {}, f"{_WHAT} combine_fn",
                              stand_ins=tuple(stand), pack=pack)
    want = ("t", 0) if n == 1 and isinstance(b["xs"], TensorVariable) else \
        (tuple if type(b["xs"]) is TupleVariable else list, [("t", i) for i in range(n)])
    if body.spec != want or not all(_same_meta(o, s) for o, s in zip(body.examples, stand)):
        unsupported(f"{_WHAT}: combine_fn returns something not shaped like xs",
                    BreakReason.UNSUPPORTED_CALL)
    aten = _aten_graph(body, stand, body.lifted, tx)
    if mode == "pointwise":
        if not _pointwise_uses(aten):
            unsupported(f"{_WHAT}: combine_mode='pointwise' with a combine_fn that is not "
                        f"pointwise (torch raises)", BreakReason.UNSUPPORTED_CALL)
        out = _emit_op(tx, body, moved)
    else:
        _check_generic(body, stand, aten)
        out = _generic_scan(tx, body, moved)
    if b["reverse"]:
        out = [_op(tx, torch.flip, y, _consts([0])) for y in out]
    out = [_op(tx, torch.movedim, y, _c(0), _c(dim)) for y in out]
    return rebuild(out)


# ---- combine_mode="pointwise": the higher-order op ------------------------------------------------

def _emit_op(tx, body, moved: list[TensorVariable]) -> list:
    from ferrodyn.variables.higher_order_ops import _emit, _run_op

    def run():
        return _OP(body.module, [x.example for x in moved],
                   tuple(n.meta["example_value"] for n in body.lifted))

    examples = list(_run_op(tx, _WHAT, run))
    get = install_subgraph(tx.output, "associative_scan_combine_fn", body.module)
    nodes = [x.fx_arg(tx)[0] for x in moved]
    return _emit(tx, _OP, (get, nodes, tuple(body.lifted)), {}, examples, "associative_scan")


# ---- combine_mode="generic": the frontend's decomposition ----------------------------------------

def _check_generic(body, stand: list, aten: torch.fx.GraphModule) -> None:
    rank = stand[0].dim()
    lifted = [n.meta["example_value"] for n in body.lifted]
    ok = (_strictly_pointwise(aten)
          and all(s.shape == stand[0].shape for s in stand)
          and all(isinstance(t, torch.Tensor) and t.dim() <= rank for t in lifted)
          and (rank > 0 or not lifted
               or len({t.dtype for t in [*stand, *lifted]}) == 1))
    nodes_ok = all(n.op in ("placeholder", "output", "call_function", "call_method")
                   for n in body.module.graph.nodes)
    if not (ok and nodes_ok):
        unsupported(f"{_WHAT}: combine_mode='generic' with a combine_fn that is not elementwise "
                    f"over slices of one shape (its vmap is not traced)",
                    BreakReason.UNSUPPORTED_CALL)


def _replay(tx, body, operands: list[TensorVariable]) -> list[TensorVariable]:
    """The body's ops recorded again over `operands` (then the lifted tensors)."""
    graph = body.module.graph
    env: dict[torch.fx.Node, Any] = {}
    phs = [p for p in graph.nodes if p.op == "placeholder"]
    lifted = [TensorVariable(node=p, example=p.meta["example_value"]) for p in body.lifted]
    for p, v in zip(phs, [*operands, *lifted]):
        env[p] = v

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (tuple, list)):
            items = [arg(i) for i in a]
            return TupleVariable(items=tuple(items)) if isinstance(a, tuple) \
                else ListVariable.new(items)
        return _c(a)

    for node in graph.nodes:
        if node.op in ("call_function", "call_method"):
            env[node] = record_op(tx, node.op, node.target, [arg(a) for a in node.args],
                                  {k: arg(v) for k, v in node.kwargs.items()})
        elif node.op == "output":
            outs = node.args[0]
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            return [tx.realize(env[o]) for o in outs]
    raise AssertionError("a graph without output")


def _interleave(tx, a, b):
    la, lb = a.example.shape[0], b.example.shape[0]
    trunc = la == lb + 1
    if trunc:
        nd = b.example.dim()
        pad = [0] * ((nd - 1) * 2 + 1) + [1] + [0] * (nd * 2 - ((nd - 1) * 2 + 2))
        b = _op(tx, torch.nn.functional.pad, b, _consts(pad))
    stacked = _op(tx, torch.stack, ListVariable.new([a, b]), dim=_c(1))
    out = _op(tx, torch.flatten, stacked, start_dim=_c(0), end_dim=_c(1))
    if trunc:
        out = _op(tx, _SLICE, out, _c(0), _c(0), _c(la + lb))  # b was padded by one
    return out


def _generic_scan(tx, body, elems: list) -> list:
    n = elems[0].example.shape[0]
    if n < 2:
        return elems

    def combine(left, right):
        out = _replay(tx, body, [*left, *right])
        if not all(isinstance(o, TensorVariable) for o in out):
            unsupported(f"{_WHAT}: combine_fn body output", BreakReason.UNSUPPORTED_CALL)
        return out

    reduced = combine([_op(tx, _SLICE, e, _c(0), _c(0), _c(-1), _c(2)) for e in elems],
                      [_op(tx, _SLICE, e, _c(0), _c(1), _c(None), _c(2)) for e in elems])
    odd = _generic_scan(tx, body, reduced)
    evens = [_op(tx, _SLICE, e, _c(0), _c(2), _c(None), _c(2)) for e in elems]
    if n % 2 == 0:
        even = combine([_op(tx, _SLICE, e, _c(0), _c(0), _c(-1)) for e in odd], evens)
    else:
        even = combine(odd, evens)
    merged = []
    for elem, result in zip(elems, even):
        if result.example.numel() > 0 and elem.example.shape[0] > 0:
            first = _op(tx, _SLICE, elem, _c(0), _c(0), _c(1))
            merged.append(_op(tx, torch.cat, ListVariable.new([first, result]), dim=_c(0)))
        elif result.example.numel() > 0:
            merged.append(result)
        else:
            merged.append(_op(tx, _SLICE, elem, _c(0), _c(0), _c(1)))
    return [_interleave(tx, e, o) for e, o in zip(merged, odd)]


SCAN_HANDLERS: dict[Any, Callable] = {
    _frontend: _associative_scan,
}

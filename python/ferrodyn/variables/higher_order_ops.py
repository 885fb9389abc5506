"""Higher-order ops captured with a traced body: `torch.utils.checkpoint.checkpoint` as
`torch.ops.higher_order.tag_activation_checkpoint` and `torch.cond` as
`torch.ops.higher_order.cond`, the nodes torch.compile emits for them.

checkpoint(fn, *args, use_reentrant=..., **fn_kwargs): `fn` is speculated (higher_order.py)
into a GraphModule `wrap_body_<n>` installed on the outer graph; the node is
`tag_activation_checkpoint(get_attr wrap_body_<n>, *lifted, use_reentrant=...)` and its
outputs are read with `getitem`. The op's eager implementation runs the real (non-reentrant)
checkpoint over the body, and aot backends recompute it as a partitioner decision. Refused (the
call graph-breaks; the body then runs eagerly under the real checkpoint): `use_reentrant`
missing (torch warns) or not a constant, a non-default `context_fn`, `debug`,
`determinism_check` or `respect_saved_tensors_hooks`; a body with random ops (torch's op does
not restore the RNG state in its eager implementation, so a recomputed dropout would differ
from the forward's); `use_reentrant=True` with keyword arguments for `fn` (eager raises), or
where the reentrant Function would mark an output differently (grad mode on, no tensor argument
requiring grad, or an output that does not require grad).

cond(pred, true_fn, false_fn, operands): a constant `pred` calls the branch it picks; a tensor
`pred` speculates both branches over the operands (tensors), gives both bodies the same
placeholders (the operands and the union of what either lifts), and emits
`cond(pred, get_attr cond_true_<n>, get_attr cond_false_<n>, (inputs...))`; the node's example
value is the op run on fake tensors (which checks that the branches agree).

Owns `HIGHER_ORDER_HANDLERS` (merged into torch_fns.TORCH_HANDLERS). Does not own the
speculation (higher_order.py) or recording plain torch calls (torch_fns.py).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
import torch.utils.checkpoint as _ckpt

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.higher_order import (
    install_subgraph, rebuild_output, same_structure, speculate_subgraph,
)
from ferrodyn.variables.lists import ListVariable, TupleVariable
from ferrodyn.variables.tensor import TensorVariable, wrap_graph_value

_TAG_AC = torch.ops.higher_order.tag_activation_checkpoint
_COND = torch.ops.higher_order.cond

# checkpoint's own keyword arguments and the values captured (anything else: refused)
_CKPT_DEFAULTS: dict[str, Callable[[Any], bool]] = {
    "use_reentrant": lambda v: type(v) is bool,
    "preserve_rng_state": lambda v: type(v) is bool,
    "context_fn": lambda v: v is _ckpt.noop_context_fn,
    "determinism_check": lambda v: v == _ckpt._DEFAULT_DETERMINISM_MODE,
    "debug": lambda v: v is False,
    "early_stop": lambda v: type(v) is bool,
    "respect_saved_tensors_hooks": lambda v: v is None,
}

# torch / torch.nn.functional callables (by __name__) and tensor methods that draw random numbers
_RANDOM_FUNCTIONS = frozenset({
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm",
    "bernoulli", "multinomial", "normal", "poisson", "binomial", "rrelu", "rrelu_",
    "gumbel_softmax", "native_dropout", "dropout", "dropout1d", "dropout2d", "dropout3d",
    "alpha_dropout", "feature_alpha_dropout", "dropout_", "alpha_dropout_",
    "feature_alpha_dropout_", "feature_dropout", "feature_dropout_",
    # torch.nn.init
    "uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_",
    "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
})
_RANDOM_METHODS = frozenset({
    "uniform_", "normal_", "bernoulli_", "bernoulli", "random_", "exponential_", "geometric_",
    "log_normal_", "cauchy_", "multinomial",
})


def _const(tx, v, what: str) -> Any:
    v = tx.realize(v)
    if not v.is_python_constant():
        unsupported(f"{what} that is not a constant", BreakReason.UNSUPPORTED_CALL)
    return v.as_python_constant()


def _dropout_inactive(node: torch.fx.Node) -> bool:
    """F.dropout(x, p, training, inplace) with training False or p == 0 draws nothing."""
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    training = node.kwargs.get("training", node.kwargs.get(
        "train", node.args[2] if len(node.args) > 2 else True))
    return training is False or (type(p) in (int, float) and p == 0)


def _seeded_op(target) -> bool:
    """An aten op tagged nondeterministic_seeded (any overload of a packet)."""
    if isinstance(target, torch._ops.OpOverload):
        return torch.Tag.nondeterministic_seeded in target.tags
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(torch.Tag.nondeterministic_seeded in getattr(target, o).tags
                   for o in target.overloads())
    return False


def _draws_random(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target in _RANDOM_METHODS:
            return True
        if node.op != "call_function":
            continue
        target = node.target
        if target is torch.nn.functional.scaled_dot_product_attention:
            p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
            if not (type(p) in (int, float) and p == 0):
                return True
            continue
        if _seeded_op(target):
            return True
        name = getattr(target, "__name__", "")
        if name in _RANDOM_FUNCTIONS and not (
                "dropout" in name and _dropout_inactive(node)):
            return True
        if getattr(target, "autograd_function", None) is not None:
            return True  # an opaque custom Function: its forward may draw
    return any(_draws_random(m) for m in gm.children() if isinstance(m, torch.fx.GraphModule))


def _emit(tx, target, args: tuple, kwargs: dict, examples: list, name: str) -> list:
    """The HOP node and one `getitem` tracker per output."""
    node = tx.output.create_node("call_function", target, args, kwargs)
    node.meta["example_value"] = tuple(examples)
    items = []
    for i, ex in enumerate(examples):
        item = tx.output.create_node("call_function", operator.getitem, (node, i), {})
        items.append(wrap_graph_value(tx, item, ex, name))
    return items


# ---- checkpoint ---------------------------------------------------------------------------------

def _checkpoint(tx, args, kwargs):
    what = "torch.utils.checkpoint.checkpoint"
    if not args:
        unsupported(f"{what} without a function (its decorator form)", BreakReason.UNSUPPORTED_CALL)
    fn, fn_args = tx.realize(args[0]), list(args[1:])
    options, fn_kwargs = {}, {}
    for k, v in kwargs.items():
        (options if k in _CKPT_DEFAULTS else fn_kwargs)[k] = v
    values = {}
    for k, v in options.items():
        values[k] = _const(tx, v, f"{what} with {k}")
        if not _CKPT_DEFAULTS[k](values[k]):
            unsupported(f"{what} with {k}={values[k]!r}", BreakReason.UNSUPPORTED_CALL)
    reentrant = values.get("use_reentrant")
    if reentrant is None:
        unsupported(f"{what} without use_reentrant (torch warns and picks reentrant)",
                    BreakReason.UNSUPPORTED_CALL)
    if reentrant and fn_kwargs:
        unsupported(f"{what} with use_reentrant=True and keyword arguments for the function",
                    BreakReason.UNSUPPORTED_CALL)
    body = speculate_subgraph(tx, fn, fn_args, fn_kwargs, f"{what} body")
    if _draws_random(body.module):
        unsupported(f"{what} of a body with random ops (the captured op would not replay the "
                    f"RNG state when it recomputes)", BreakReason.UNSUPPORTED_CALL)
    if reentrant and torch.is_grad_enabled():
        flat = [tx.realize(a) for a in fn_args]
        if not any(isinstance(a, TensorVariable) and a.example.requires_grad for a in flat) or \
                not all(e.requires_grad for e in body.examples):
            unsupported(f"{what} with use_reentrant=True where the reentrant Function marks "
                        f"outputs differently (no input requiring grad, or an output that "
                        f"does not require grad)", BreakReason.UNSUPPORTED_CALL)
    get = install_subgraph(tx.output, "wrap_body", body.module)
    items = _emit(tx, _TAG_AC, (get, *body.lifted), {"use_reentrant": reentrant},
                  body.examples, "tag_activation_checkpoint")
    return rebuild_output(tx, body.spec, items)


# ---- cond ---------------------------------------------------------------------------------------

_COND_PARAMS = ("pred", "true_fn", "false_fn", "operands")


def _bind_cond(args, kwargs) -> dict:
    bound = dict(zip(_COND_PARAMS, args))
    for k, v in kwargs.items():
        if k not in _COND_PARAMS or k in bound:
            unsupported(f"torch.cond with argument {k!r}", BreakReason.UNSUPPORTED_CALL)
        bound[k] = v
    if len(args) > 4 or any(p not in bound for p in _COND_PARAMS[:3]):
        unsupported("torch.cond with unexpected arguments", BreakReason.UNSUPPORTED_CALL)
    return bound


def _align(sub, order: list[torch.fx.Node]) -> None:
    """Give the body one placeholder per node of `order`, in that order."""
    graph = sub.module.graph
    have = dict(zip(sub.lifted, sub.output._placeholders))
    first = next(iter(graph.nodes))
    for parent_node in order:
        if parent_node not in have:
            with graph.inserting_before(first):
                ph = graph.placeholder(f"{parent_node.name}_unused")
            ph.meta["example_value"] = parent_node.meta.get("example_value")
            have[parent_node] = ph
    for parent_node in reversed(order):  # move each to the front: the order of `order`
        ph = have[parent_node]
        first = next(iter(graph.nodes))
        if ph is not first:
            first.prepend(ph)
    graph.lint()
    sub.module.recompile()
    sub.lifted = list(order)


def _cond(tx, args, kwargs):
    what = "torch.cond"
    b = _bind_cond(list(args), dict(kwargs))
    pred = tx.realize(b["pred"])
    ops = tx.realize(b.get("operands", TupleVariable(items=())))
    if type(ops) not in (TupleVariable, ListVariable):
        unsupported(f"{what} with operands that are not a tuple or list", BreakReason.UNSUPPORTED_CALL)
    operands = [tx.realize(o) for o in ops.unpack(tx)]
    if not all(isinstance(o, TensorVariable) for o in operands):
        unsupported(f"{what} with non-tensor operands", BreakReason.UNSUPPORTED_TYPE)
    if pred.is_python_constant():
        branch = b["true_fn"] if pred.as_python_constant() else b["false_fn"]
        return tx.realize(branch).call_function(tx, operands, {})
    if not isinstance(pred, TensorVariable):
        unsupported(f"{what} with a predicate of type {pred.describe()}",
                    BreakReason.UNSUPPORTED_TYPE)
    true = speculate_subgraph(tx, tx.realize(b["true_fn"]), operands, {}, f"{what} true branch")
    false = speculate_subgraph(tx, tx.realize(b["false_fn"]), operands, {},
                               f"{what} false branch")
    if not same_structure(true.spec, false.spec):
        unsupported(f"{what} with branches returning different structures",
                    BreakReason.UNSUPPORTED_CALL)
    order = list(dict.fromkeys([*true.lifted, *false.lifted]))
    _align(true, order)
    _align(false, order)

    def run():
        inputs = tuple(n.meta["example_value"] for n in order)
        return _COND(pred.example, true.module, false.module, inputs)

    try:
        example = tx.output.run_fake(run)
    except Unsupported:
        raise
    except Exception as e:
        unsupported(f"{what} raised {type(e).__name__} on fake inputs: {e}",
                    BreakReason.UNSUPPORTED_CALL)
    examples = list(example) if isinstance(example, (tuple, list)) else [example]
    if len(examples) != len(true.examples):
        unsupported(f"{what}: unexpected outputs of the op", BreakReason.UNSUPPORTED_CALL)
    get_t = install_subgraph(tx.output, "cond_true", true.module)
    get_f = install_subgraph(tx.output, "cond_false", false.module)
    pred_node, _ = pred.fx_arg(tx)
    items = _emit(tx, _COND, (pred_node, get_t, get_f, tuple(order)), {}, examples, "cond")
    return rebuild_output(tx, true.spec, items)


HIGHER_ORDER_HANDLERS: dict[Any, Callable] = {
    _ckpt.checkpoint: _checkpoint,
    torch.cond: _cond,
    _COND: _cond,
}

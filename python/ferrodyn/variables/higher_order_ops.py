"""Higher-order ops captured with traced bodies: `torch.utils.checkpoint.checkpoint` as
`torch.ops.higher_order.tag_activation_checkpoint`, `torch.cond` as `torch.ops.higher_order.cond`,
`torch._higher_order_ops.while_loop` as `while_loop` and `torch._higher_order_ops.map` as
`map_impl`: the nodes torch.compile emits for them.

checkpoint(fn, *args, use_reentrant=..., **fn_kwargs): `fn` is speculated (higher_order.py)
into a GraphModule `wrap_body_<n>` installed on the outer graph; the node is
`tag_activation_checkpoint(get_attr wrap_body_<n>, *lifted, use_reentrant=...)` and its
outputs are read with `getitem`. The op's eager implementation runs the real (non-reentrant)
checkpoint over the body, and aot backends recompute it as a partitioner decision. Refused (the
call graph-breaks; the body then runs eagerly under the real checkpoint): `use_reentrant`
missing (torch warns) or not a constant, a non-default `context_fn`, `debug`,
`determinism_check` or `respect_saved_tensors_hooks`; a body with random ops (torch's op does
not restore the RNG state in its eager implementation, so a recomputed dropout would differ
from the forward's); `use_reentrant=True` (eager's reentrant Function runs the body under
no_grad, so grad-mode reads inside it — `torch.is_grad_enabled()`, `requires_grad` of
intermediates — would differ from a trace under the caller's grad mode; transformers'
`gradient_checkpointing_enable()` defaults to use_reentrant=False).

cond(pred, true_fn, false_fn, operands): a constant `pred` calls the branch it picks; a tensor
`pred` speculates both branches over the operands (tensors), gives both bodies the same
placeholders (the operands and the union of what either lifts), and emits
`cond(pred, get_attr cond_true_<n>, get_attr cond_false_<n>, (inputs...))`; the node's example
value is the op run on fake tensors (which checks that the branches agree).

while_loop(cond_fn, body_fn, carried): both bodies are traced over fresh placeholders for the
carried tensors (the loop's own inputs, first) and share the union of what either lifts
(`while_loop(get_attr cond_fn_<n>, get_attr body_fn_<n>, carried, lifted)`); cond_fn returns one
tensor, body_fn a tuple of as many tensors as carried. map(f, xs, *args): `f` is traced over a
fresh placeholder of one slice `xs[0]` and the extra tensors
(`map_impl(get_attr map_body_<n>, [xs], [lifted])`); a tuple of mapped tensors is refused.
Both take their example values from the op run on fake tensors.

Owns `HIGHER_ORDER_HANDLERS` (merged into torch_fns.TORCH_HANDLERS). Does not own the
speculation (higher_order.py) or recording plain torch calls (torch_fns.py).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
import torch.utils.checkpoint as _ckpt
from torch._higher_order_ops.map import map as _map_fn
from torch._higher_order_ops.while_loop import while_loop as _while_loop_fn

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.higher_order import (
    install_subgraph, rebuild_output, same_structure, speculate_subgraph,
)
from ferrodyn.variables.lists import ListVariable, TupleVariable
from ferrodyn.variables.scan_ops import SCAN_HANDLERS
from ferrodyn.variables.tensor import TensorVariable, wrap_graph_value

_TAG_AC = torch.ops.higher_order.tag_activation_checkpoint
_COND = torch.ops.higher_order.cond
_WHILE = torch.ops.higher_order.while_loop
_MAP = torch.ops.higher_order.map_impl

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
    if reentrant:
        # Eager's reentrant Function runs the body under no_grad: `torch.is_grad_enabled()`,
        # `t.requires_grad` of intermediates and `t.grad_fn` read differently inside it than
        # in a trace under the caller's grad mode, and nothing here proves the body reads none.
        unsupported(f"{what} with use_reentrant=True (its body runs under no_grad in eager)",
                    BreakReason.UNSUPPORTED_CALL)
    body = speculate_subgraph(tx, fn, fn_args, fn_kwargs, f"{what} body")
    if _draws_random(body.module):
        unsupported(f"{what} of a body with random ops (the captured op would not replay the "
                    f"RNG state when it recomputes)", BreakReason.UNSUPPORTED_CALL)
    get = install_subgraph(tx.output, "wrap_body", body.module)
    items = _emit(tx, _TAG_AC, (get, *body.lifted), {"use_reentrant": False},
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


def _align(sub, order: list[torch.fx.Node], n_own: int = 0) -> None:
    """Give the body one placeholder per node of `order`, in that order, after its `n_own`
    own inputs."""
    graph = sub.module.graph
    own = sub.output._placeholders[:n_own]
    have = dict(zip(sub.lifted, sub.output._placeholders[n_own:]))
    for parent_node in order:
        if parent_node not in have:
            with graph.inserting_before(next(iter(graph.nodes))):
                ph = graph.placeholder(f"{parent_node.name}_unused")
            ph.meta["example_value"] = parent_node.meta.get("example_value")
            have[parent_node] = ph
    for ph in reversed([*own, *(have[p] for p in order)]):  # each to the front, in order
        first = next(iter(graph.nodes))
        if ph is not first:
            first.prepend(ph)
    graph.lint()
    sub.module.recompile()
    sub.lifted = list(order)


def _run_op(tx, what: str, fn):
    """The op run on fake tensors: its example value (the op checks its bodies agree)."""
    try:
        return tx.output.run_fake(fn)
    except Unsupported:
        raise
    except Exception as e:
        unsupported(f"{what} raised {type(e).__name__} on fake inputs: {e}",
                    BreakReason.UNSUPPORTED_CALL)


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

    example = _run_op(tx, what, run)
    examples = list(example) if isinstance(example, (tuple, list)) else [example]
    if len(examples) != len(true.examples):
        unsupported(f"{what}: unexpected outputs of the op", BreakReason.UNSUPPORTED_CALL)
    get_t = install_subgraph(tx.output, "cond_true", true.module)
    get_f = install_subgraph(tx.output, "cond_false", false.module)
    pred_node, _ = pred.fx_arg(tx)
    items = _emit(tx, _COND, (pred_node, get_t, get_f, tuple(order)), {}, examples, "cond")
    return rebuild_output(tx, true.spec, items)


# ---- while_loop, map ------------------------------------------------------------------------------

def _tensors(tx, what: str, seq) -> list[TensorVariable]:
    seq = tx.realize(seq)
    if type(seq) not in (TupleVariable, ListVariable):
        unsupported(f"{what} with inputs that are not a tuple or list", BreakReason.UNSUPPORTED_CALL)
    items = [tx.realize(i) for i in seq.unpack(tx)]
    if not items or not all(isinstance(i, TensorVariable) for i in items):
        unsupported(f"{what} with inputs that are not all tensors", BreakReason.UNSUPPORTED_TYPE)
    return items


def _while_loop(tx, args, kwargs):
    what = "while_loop"
    bound = dict(zip(("cond_fn", "body_fn", "carried_inputs"), args))
    bound.update(kwargs)
    if set(bound) != {"cond_fn", "body_fn", "carried_inputs"} or len(args) > 3:
        unsupported(f"{what} with unexpected arguments", BreakReason.UNSUPPORTED_CALL)
    carried = _tensors(tx, what, bound["carried_inputs"])
    from ferrodyn.variables.higher_order import fresh_fake
    stand = tuple(fresh_fake(tx, c.example) for c in carried)
    cond = speculate_subgraph(tx, tx.realize(bound["cond_fn"]), [], {}, f"{what} cond_fn",
                              stand_ins=stand, bare_output=True)
    stand = tuple(fresh_fake(tx, c.example) for c in carried)
    body = speculate_subgraph(tx, tx.realize(bound["body_fn"]), [], {}, f"{what} body_fn",
                              stand_ins=stand)
    if cond.spec != ("t", 0):
        unsupported(f"{what} cond_fn returns no tensor", BreakReason.UNSUPPORTED_CALL)
    if body.spec[0] not in (tuple, list) or len(body.spec[1]) != len(carried) or \
            any(p[0] != "t" for p in body.spec[1]):
        unsupported(f"{what} body_fn returns no tuple of {len(carried)} tensors",
                    BreakReason.UNSUPPORTED_CALL)
    order = list(dict.fromkeys([*cond.lifted, *body.lifted]))
    _align(cond, order, len(carried))
    _align(body, order, len(carried))

    def run():
        return _WHILE(cond.module, body.module, tuple(c.example for c in carried),
                      tuple(n.meta["example_value"] for n in order))

    examples = list(_run_op(tx, what, run))
    get_c = install_subgraph(tx.output, "cond_fn", cond.module)
    get_b = install_subgraph(tx.output, "body_fn", body.module)
    carried_nodes = tuple(c.fx_arg(tx)[0] for c in carried)
    items = _emit(tx, _WHILE, (get_c, get_b, carried_nodes, tuple(order)), {}, examples, what)
    return rebuild_output(tx, (tuple, [("t", i) for i in range(len(items))]), items)


def _map(tx, args, kwargs):
    what = "torch._higher_order_ops.map"
    if kwargs or len(args) < 2:
        unsupported(f"{what} with keyword arguments", BreakReason.UNSUPPORTED_CALL)
    fn, xs = tx.realize(args[0]), tx.realize(args[1])
    xs_items = [xs] if isinstance(xs, TensorVariable) else _tensors(tx, what, xs)
    if any(x.example.dim() == 0 for x in xs_items):
        unsupported(f"{what} over a 0-d tensor", BreakReason.UNSUPPORTED_CALL)
    extra = [tx.realize(a) for a in args[2:]]
    if not all(isinstance(a, TensorVariable) for a in extra):
        unsupported(f"{what} with non-tensor extra arguments", BreakReason.UNSUPPORTED_TYPE)
    from ferrodyn.variables.higher_order import fresh_fake
    stand = tuple(tx.output.run_fake(lambda x=x: fresh_fake(tx, x.example[0]))
                  for x in xs_items)
    if not isinstance(xs, TensorVariable):  # the body would take a tuple of slices
        unsupported(f"{what} over a {xs.describe()}", BreakReason.UNSUPPORTED_CALL)
    body = speculate_subgraph(tx, fn, extra, {}, f"{what} body", stand_ins=stand)
    if body.spec[0] == "c" or _has_const(body.spec):
        unsupported(f"{what} body returns a constant", BreakReason.UNSUPPORTED_CALL)
    xs_nodes = [x.fx_arg(tx)[0] for x in xs_items]

    def run():
        return _MAP(body.module, [x.example for x in xs_items],
                    [n.meta["example_value"] for n in body.lifted])

    examples = list(_run_op(tx, what, run))
    get = install_subgraph(tx.output, "map_body", body.module)
    items = _emit(tx, _MAP, (get, xs_nodes, list(body.lifted)), {}, examples, what)
    return rebuild_output(tx, body.spec, items)


def _has_const(spec) -> bool:
    if spec[0] == "c":
        return True
    return spec[0] in (tuple, list) and any(_has_const(p) for p in spec[1])


HIGHER_ORDER_HANDLERS: dict[Any, Callable] = {
    _ckpt.checkpoint: _checkpoint,
    torch.cond: _cond,
    _COND: _cond,
    _while_loop_fn: _while_loop,
    _WHILE: _while_loop,
    _map_fn: _map,
    **SCAN_HANDLERS,  # associative_scan (scan_ops.py)
}

"""`ferrodyn.make_fx`: trace a function to an aten-level `torch.fx.GraphModule`.

Owns: the entry point and its argument checking, the choice and set-up of the modes for each
tracing mode ("real": real tensors; "fake": FakeTensorMode with static shapes; "symbolic":
FakeTensorMode over a ShapeEnv, every input size a SymInt), input placeholders, the output node
(any result pytree: leaves become nodes or constants, the structure is rebuilt exactly),
the final dead-code pass and the GraphModule. Also owns `last_trace`, a debug hook that lets
tests inspect the tracker of the most recent trace after it ended.

Does not own: the per-op recording (mode.py), the value tracking (tracker.py), or making
fake inputs and symbols: the fake mode, fake tensors and SymInts come from symbolic_shapes.py,
the one implementation shared with ferrodyn.compile(dynamic=True).

    make_fx(fn, ...)(*args)
      └─ _Trace.run
           ├─ check fn and args; build the fake mode (fake/symbolic; its ShapeEnv-cache entries
           │  are checked at first use, fake_cache.py) and fakify the inputs
           ├─ placeholders, tracked inputs
           ├─ enter modes (fake, python dispatcher, proxy) ─► fn(*inputs) ─► exit modes (always)
           ├─ snapshot the values autograd marked or made views (tracker.finish_vals)
           ├─ output node (_output_node), dead-code elimination, symint dedupe
           └─ GraphModule (the tracker's dictionaries are cleared whatever happened)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import Tensor

from torch._subclasses.fake_tensor import FakeTensor

from ferrodyn import symbolic_shapes
from ferrodyn.proxy_dispatch import fake_cache
from ferrodyn.proxy_dispatch.mode import PreDispatchFunctionMode, make_mode
from ferrodyn.proxy_dispatch.tracker import SYM_TYPES, ProxyTracker, set_tensor_meta

TRACING_MODES = ("real", "fake", "symbolic")

# Leaves an argument pytree may hold: tensors, and the scalars and torch enums an aten op
# accepts as a constant. Anything else (an arbitrary object) is refused with a clear error:
# torch's make_fx silently bakes such values in, which hides mistakes.
_CONSTANT_LEAVES = (
    bool, int, float, complex, str, type(None),
    torch.dtype, torch.device, torch.layout, torch.memory_format,
)

_aten = torch.ops.aten

last_trace: dict = {}
"""Debug hook: after each trace (successful or not), `last_trace["tracker"]` is the tracker it
used, so tests can check that its weak dictionaries are empty and no mode is left behind."""


def make_fx(
    f,
    decomposition_table: Mapping | None = None,
    tracing_mode: str = "real",
    _allow_non_fake_inputs: bool = False,
    *,
    pre_dispatch: bool = False,
):
    """Return a function that, called with example arguments, runs `f` on them and returns a
    `torch.fx.GraphModule` of the aten operations it executed (torch's `make_fx` convention).

    tracing_mode: "real" runs on the real inputs; "fake" on FakeTensors (static shapes);
    "symbolic" on FakeTensors with symbolic sizes (the graph then works for other sizes).
    decomposition_table: {OpOverload: python decomposition}, applied while tracing.
    pre_dispatch: trace above autograd (CompositeImplicit ops are kept, grad-mode changes are
    recorded).
    Tensors closed over by `f` (constants, parameters) become `get_attr` attributes of the
    result; in fake/symbolic mode they are fakified on use.
    """
    if not callable(f):
        raise TypeError(f"make_fx: expected a callable to trace, got {type(f).__name__}: {f!r:.80}")
    if tracing_mode not in TRACING_MODES:
        raise ValueError(f"make_fx: tracing_mode must be one of {TRACING_MODES}, got {tracing_mode!r}")
    if decomposition_table is not None and not isinstance(decomposition_table, Mapping):
        raise TypeError(
            "make_fx: decomposition_table must be a mapping {OpOverload: callable}, got "
            f"{type(decomposition_table).__name__}"
        )
    table = dict(decomposition_table or {})
    from torch._decomp import decompositions

    table.setdefault(_aten.sym_numel.default, decompositions.sym_numel)
    if decomposition_table is None and not pre_dispatch:
        table.setdefault(_aten.detach.default, decompositions.nop_decomposition)

    @functools.wraps(f)
    def wrapped(*args):
        return _Trace(f, table, tracing_mode, pre_dispatch, _allow_non_fake_inputs).run(args)

    return wrapped


def _check_args(args) -> tuple[list, object]:
    flat, spec = pytree.tree_flatten(args)
    for leaf in flat:
        if not isinstance(leaf, (Tensor, *SYM_TYPES, *_CONSTANT_LEAVES)):
            for path, value in pytree.tree_flatten_with_path(args)[0]:
                if value is leaf:
                    where = "args" + pytree.keystr(path)
                    break
            else:  # pragma: no cover - the leaf came from the same flattening
                where = "an argument"
            raise TypeError(
                f"make_fx: {where} is a {type(leaf).__module__}.{type(leaf).__qualname__}; "
                "make_fx takes tensors, numbers, and lists/tuples/dicts of them (pass other "
                "values through a closure instead)"
            )
    return flat, spec


def _arg_names(f, nargs: int) -> list[str]:
    """Placeholder base names: the positional parameter names of `f` where they can be read,
    else arg0, arg1, ... (what torch's tracer names them)."""
    fn = inspect.unwrap(f)
    code = getattr(fn, "__code__", None)
    if code is not None and not code.co_flags & inspect.CO_VARARGS:
        names = list(code.co_varnames[: code.co_argcount])
        if inspect.ismethod(fn):
            names = names[1:]
        if len(names) >= nargs:
            return names[:nargs]
    return [f"arg{i}" for i in range(nargs)]


@contextmanager
def _autocast_cache_disabled():
    # the autocast cache hands out cached casts of parameters: tensors the trace never saw
    old = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(old)


class _Trace:
    def __init__(self, f, table, tracing_mode, pre_dispatch, allow_non_fake_inputs):
        self.f = f
        self.table = table
        self.tracing_mode = tracing_mode
        self.pre_dispatch = pre_dispatch
        self.allow_non_fake_inputs = allow_non_fake_inputs

    # -- fake mode --------------------------------------------------------------------------
    def _fake_mode(self, flat):
        if self.tracing_mode == "real":
            return None
        from torch._guards import detect_fake_mode

        mode = detect_fake_mode(flat)
        if mode is None:
            mode = symbolic_shapes.new_fake_mode(self.tracing_mode)
            fake_cache.install(mode)  # its ShapeEnv is this trace's own
            return mode
        if self.tracing_mode == "symbolic" and mode.shape_env is None:
            raise ValueError("make_fx(tracing_mode='symbolic'): the inputs' FakeTensorMode has no ShapeEnv")
        return mode

    def _fakify(self, flat, mode):
        """Fake inputs through symbolic_shapes, the code path of ferrodyn.compile's inputs: in
        symbolic mode every dim of a real tensor is a duck-sized symbol and an int is a symbol
        too (torch's make_fx); sources name the flat input (`input<i>`)."""
        if mode is None:
            return list(flat)
        from torch._dynamo.source import ConstantSource

        symbolic = self.tracing_mode == "symbolic"
        out = []
        for i, x in enumerate(flat):
            source = ConstantSource(f"input{i}")
            if isinstance(x, Tensor):
                dims = range(x.dim()) if symbolic and not isinstance(x, FakeTensor) else ()
                x, _ = symbolic_shapes.fake_input(mode, x, source, dims, duck=True,
                                                  static_shapes=None)
            elif type(x) is int and symbolic:
                x = symbolic_shapes.symint_input(mode.shape_env, x, source, duck=True)
            out.append(x)
        return out

    # -- the trace --------------------------------------------------------------------------
    def run(self, args) -> fx.GraphModule:
        flat, in_spec = _check_args(args)
        fake_mode = self._fake_mode(flat)
        tracker = ProxyTracker(fake_mode=fake_mode, symbolic=self.tracing_mode == "symbolic")
        last_trace["tracker"] = tracker
        try:
            return self._run(tracker, args, flat, in_spec, fake_mode)
        finally:
            tracker.forget()

    def _run(self, tracker, args, flat, in_spec, fake_mode):
        inputs = self._fakify(flat, fake_mode)
        graph = tracker.graph
        nested = not all(child.is_leaf() for child in in_spec.children())

        # placeholders: one per flat leaf, named after the parameter it belongs to
        names = _arg_names(self.f, len(args))
        leaf_names = []
        for name, a in zip(names, args):
            n = len(pytree.tree_leaves(a)) if nested else 1
            leaf_names.extend(f"{name}_{j + 1}" for j in range(n))
        for x, name in zip(inputs, leaf_names):
            node = tracker.placeholder(name, x)
            if isinstance(x, Tensor):
                tracker.track_tensor(x, node)
                tracker.lazy = True  # symbolic arithmetic of the memory-format checks: lazy
                try:
                    set_tensor_meta(node, x, tracker.format_memo)
                finally:
                    tracker.lazy = False
            elif isinstance(x, SYM_TYPES):
                tracker.set_sym(x, node)
        call_args = pytree.tree_unflatten(inputs, in_spec) if nested else tuple(inputs)

        mode = make_mode(
            tracker, decomposition_table=self.table, pre_dispatch=self.pre_dispatch
        )
        with ExitStack() as stack:
            if fake_mode is not None:
                stack.enter_context(fake_mode)
            if self.tracing_mode == "symbolic" or self.pre_dispatch:
                from torch._dispatch.python import enable_python_dispatcher

                stack.enter_context(enable_python_dispatcher())
            if self.pre_dispatch:
                stack.enter_context(PreDispatchFunctionMode(tracker))
            stack.enter_context(mode)
            stack.enter_context(_autocast_cache_disabled())
            out = self.f(*call_args)
        tracker.finish_vals()

        _output_node(tracker, out, in_spec if nested else None, names)

        graph.eliminate_dead_code(_is_impure)
        if fake_mode is not None and fake_mode.shape_env is not None:
            _dedupe_symints(graph)
        name = type(self.f).__name__ if isinstance(self.f, torch.nn.Module) else getattr(
            self.f, "__name__", type(self.f).__name__
        )
        gm = fx._lazy_graph_module._make_graph_module(tracker.root, graph, name)
        if self.tracing_mode == "symbolic":
            gm.shape_env = fake_mode.shape_env
        return gm


# Output leaves that fx's code generator writes as source text that evaluates back to an equal
# value of the same type. Every other non-traced leaf becomes a `get_attr` of the root module.
_LITERAL_LEAVES = frozenset(
    {bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format}
)
# Containers fx writes inline as Python displays; any other pytree node type (torch.Size,
# torch.return_types, namedtuples, OrderedDict, ...) is rebuilt from the output TreeSpec.
_INLINE_CONTAINERS = frozenset({tuple, list, dict, type(None)})  # torch.Size: see _output_leaf


def _output_node(tracker: ProxyTracker, out, in_spec, names) -> fx.Node:
    """The graph's output node for the traced function's result `out`, any pytree.

    `out` is flattened with torch's pytree; each leaf becomes a graph argument (`_output_leaf`)
    and the structure is rebuilt from the TreeSpec: written inline when fx's displays reproduce
    it exactly (tuples, lists, str/int-keyed dicts), else by the generated code's
    `pytree.tree_unflatten(..., self._out_spec)` (also when the inputs are nested, whose
    placeholders need the input spec)."""
    leaves, out_spec = pytree.tree_flatten(out, is_leaf=_is_size)
    args = [_output_leaf(tracker, leaf) for leaf in leaves]
    graph = tracker.graph
    if in_spec is None and _renders_inline(out_spec):
        return graph.output(pytree.tree_unflatten(args, out_spec))
    node = graph.output(args)
    graph._codegen = _OutputTreeCodeGen(fx.graph._PyTreeInfo(names, in_spec, out_spec))
    return node


def _renders_inline(spec) -> bool:
    if spec.is_leaf():
        return True
    if spec.type not in _INLINE_CONTAINERS:
        return False
    if spec.type is dict and not all(type(k) in (str, int) for k in spec.context):
        return False
    return all(_renders_inline(c) for c in spec.children())


def _output_leaf(tracker: ProxyTracker, leaf):
    """The graph argument for one leaf of the result: the node of a traced tensor or symbolic
    value (a constant tensor becomes a `get_attr` attribute), a literal, or a `get_attr` of the
    object itself (returned as is by every call, as tracing bakes it in)."""
    if isinstance(leaf, Tensor):
        return tracker.tensor_node(leaf)
    if isinstance(leaf, SYM_TYPES):
        return tracker.sym_node(leaf)
    if leaf is None or type(leaf) in _LITERAL_LEAVES:
        return leaf
    if type(leaf) is torch.Size:
        # torch's pytree rebuilds a Size as a plain tuple, and fx writes one as a tuple
        # display: the graph builds it
        dims = [_output_leaf(tracker, d) for d in leaf]
        node = tracker.graph.call_function(torch.Size, (dims,))
        node.meta["val"] = leaf
        return node
    return tracker.object_node(leaf)


def _is_size(x) -> bool:
    return type(x) is torch.Size


class _OutputTreeCodeGen(fx.graph._PyTreeCodeGen):
    """torch's pytree code generator, for the output only when `in_spec` is None: the forward
    then takes its placeholders as they are (no input flattening per call)."""

    def process_inputs(self, *inputs):
        if self.pytree_info.in_spec is None:
            return inputs
        return super().process_inputs(*inputs)

    def gen_fn_def(self, free_vars, maybe_return_annotation, *, expanded_def=False):
        if self.pytree_info.in_spec is None:
            return fx.graph.CodeGen.gen_fn_def(
                self, free_vars, maybe_return_annotation, expanded_def=expanded_def
            )
        return super().gen_fn_def(free_vars, maybe_return_annotation, expanded_def=expanded_def)


_ACCESSORS = frozenset(
    {
        _aten.sym_size.int, _aten.sym_size.default, _aten.sym_stride.int,
        _aten.sym_stride.default, _aten.sym_storage_offset.default, _aten.sym_numel.default,
    }
)


def _is_impure(n: fx.Node) -> bool:
    """Dead-code policy: only size accessors and pure SymInt arithmetic may be dropped; an op
    whose result is unused stays (it may have effects the graph must keep, as in torch)."""
    if n.is_impure():
        return True
    if n.op == "call_function" and n.target in _ACCESSORS:
        return False
    if isinstance(n.meta.get("val"), SYM_TYPES) and all(
        isinstance(a.meta.get("val"), SYM_TYPES) for a in n.args if isinstance(a, fx.Node)
    ):
        return False
    return True


def _dedupe_symints(graph: fx.Graph) -> None:
    """Reuse one node per symbolic expression when it can be computed from inputs alone (so a
    size read twice, or an int input equal to a size, is one node; among placeholders of one
    expression the last one is used, as torch's dedupe_symints)."""
    seen: dict = {}
    from_inputs: set = set()
    for node in list(graph.nodes):
        val = node.meta.get("val")
        if not isinstance(val, SYM_TYPES):
            continue
        key = (type(val), val.node.expr)
        if node.op == "placeholder":
            from_inputs.add(node)
            seen[key] = node  # the last placeholder of an expression wins, as in torch
        elif key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
        elif all(a in from_inputs for a in node.all_input_nodes):
            seen[key] = node
            from_inputs.add(node)


__all__ = ["make_fx", "last_trace"]

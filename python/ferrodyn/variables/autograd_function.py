"""Custom autograd Functions: `Cls.apply(*args, **kwargs)` for a subclass `Cls` of
`torch.autograd.Function`, captured as ONE opaque graph node `call_function(Cls_apply, args,
kwargs)`.

At run time the graph calls the real `Cls.apply` on the real tensors (with the frame's own
positional and keyword arguments, so apply binds them as in eager), so autograd records the
user's Function exactly as in eager (its `backward` runs on `.backward()`); aot backends trace
through the call with make_fx. Capturing is only sound when running `apply` inside the graph
is indistinguishable from running it at its place in the frame, which this module proves by
*speculation*: `forward` (and `setup_context`, then `backward`) are traced with the converter
into a throwaway graph (`_SpeculationGraph`: the parent's FakeTensorMode, its own SideEffects
table, no new graph inputs), over fresh stand-ins of the arguments as apply binds them to
forward (`_bind`: keywords by forward's `__code__`; a setup_context forward gets its
defaults) (tensors: detached fake twins; constants; tuples/lists of those; exact dicts keyed
by constants, as new dicts checked unchanged after forward) and a modelled `ctx`
(`FunctionCtxVariable`). The call is refused (the caller graph-breaks there, as for any
unmodelled call) when the speculation records a side effect visible outside the Function
(mutations of existing objects, global or attribute stores, prints, logging), reads a tensor
that is not an argument (a global or a module parameter), cannot be traced, or uses
`ctx.save_for_forward`; also for overridden `vmap`, keyword arguments apply would reject or
that bind to keyword-only / *args / **kwargs parameters, and `forward` / `backward` /
`setup_context` / `jvp` that are not plain static Python functions. A forward writing to its
arguments in place (marked dirty or not) is captured: the node writes at its place in the
graph, its target's name ends in "_" so the graph's input-mutation check counts it, and an
argument returned as itself (`ctx.mark_dirty`) keeps its tracker. The guards the speculation
installs (identities of `forward`, `backward`, globals read, forward's defaults when bound) are
copied to the caller's graph. The node's example value is the real `Cls.apply` run on the fake
arguments under the caller's FakeTensorMode and grad mode, so `requires_grad`,
non-differentiable outputs and metadata are eager's; a tensor or a tuple/list holding tensors
may be returned, beside constants (None, numbers, strings, tuples/lists of those).

Owns `AutogradFunctionApplyVariable` (the tracker of `Cls.apply`), `apply_of_class` (the hook
ClassVariable's attribute lookup consults), `build_apply` (the builder's hook for a stored
bound `Cls.apply`) and `FunctionCtxVariable`. Does not own inlining (symbolic/inline.py),
recording ordinary ops (tensor.py) or the graph (output_graph.py).
"""

from __future__ import annotations

import inspect
import operator
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.guard_spec import GuardKind
from ferrodyn.output_graph import OutputGraph
from ferrodyn.source import AttrSource, Source
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable, is_constant_value
from ferrodyn.variables.lists import ListVariable, TupleVariable
from ferrodyn.variables.tensor import TensorVariable, fx_args, wrap_graph_value

_Function = torch.autograd.Function
_BASE_APPLY = _Function.__dict__.get("apply")
_BASE_SETUP_CONTEXT = torch.autograd.function._SingleLevelFunction.setup_context
_BASE_VMAP = _Function.vmap
_BASE_JVP = torch.autograd.function._SingleLevelFunction.jvp
_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _is_function_class(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, _Function) and cls is not _Function


def _inherits_base_apply(cls: type) -> bool:
    for klass in cls.__mro__:
        if "apply" in klass.__dict__:
            return klass.__dict__["apply"] is _BASE_APPLY
    return False


def apply_of_class(tx, cls_var, name: str) -> VariableTracker | None:
    """`Cls.apply` read from a ClassVariable: the tracker, or None when `Cls` is no Function
    subclass or overrides `apply`. Guards that `Cls.apply` is still a C bound method (a Python
    override installed later would be a bound method of another type)."""
    cls = cls_var.value
    if name != "apply" or not _is_function_class(cls) or not _inherits_base_apply(cls):
        return None
    source = AttrSource(cls_var.source, "apply") if cls_var.source is not None else None
    if source is not None:
        tx.output.install_guard(source, GuardKind.TYPE_MATCH, types.BuiltinMethodType)
    return AutogradFunctionApplyVariable(source=source, cls=cls, cls_source=cls_var.source)


def build_apply(value: Any, source: Source | None) -> VariableTracker | None:
    """A bound `Cls.apply` stored somewhere (`gelu = GeLUFunction.apply`), identified by
    identity (the builder guards ID_MATCH); None for any other value."""
    if type(value) is not types.BuiltinMethodType or getattr(value, "__name__", None) != "apply":
        return None
    cls = getattr(value, "__self__", None)
    if not _is_function_class(cls) or not _inherits_base_apply(cls) or value != cls.apply:
        return None
    cls_source = AttrSource(source, "__self__") if source is not None else None
    return AutogradFunctionApplyVariable(source=source, cls=cls, cls_source=cls_source)


@dataclass(frozen=True, eq=False)
class AutogradFunctionApplyVariable(VariableTracker):
    """`Cls.apply` of a custom autograd Function."""

    cls: type = None  # type: ignore[assignment]
    cls_source: Source | None = None

    def python_type(self):
        return types.BuiltinMethodType

    def describe(self):
        return f"{self.cls.__name__}.apply"

    def call_function(self, tx, args, kwargs):
        return call_apply(tx, self.cls, self.cls_source, list(args), dict(kwargs))


# ---- the call ----------------------------------------------------------------------------------

def call_apply(tx, cls: type, cls_source: Source | None, args: list, kwargs: dict):
    name = f"{cls.__name__}.apply"
    if cls_source is None:  # what forward reads could not be guarded
        unsupported(f"{name} of a class not reachable from the frame",
                    BreakReason.UNSUPPORTED_CALL)
    _check_class(tx, cls, cls_source)
    args = [tx.realize(a) for a in args]
    kwargs = {k: tx.realize(v) for k, v in kwargs.items()}
    for a in (*args, *kwargs.values()):
        _check_arg(tx, name, a)
    writes = _speculate(tx, cls, cls_source, _bind(tx, cls, cls_source, args, kwargs))
    # the node calls apply with the frame's own arguments: apply binds them as in eager
    pa, ea, pk, ek = fx_args(tx, args, kwargs)

    def run():
        return cls.apply(*ea, **ek)

    try:
        example = tx.output.run_fake(run)
    except Unsupported:
        raise
    except Exception as e:
        unsupported(f"{name} raised {type(e).__name__} on fake inputs: {e}",
                    BreakReason.UNSUPPORTED_CALL)
    node = tx.output.create_node("call_function", _apply_target(cls, writes), tuple(pa), pk)
    if not writes:
        return _wrap_outputs(tx, node, example, name)
    # forward writes to arguments in place: the node does so at its place in the graph, so
    # later ops read the written tensors as in eager; the fold cache is invalidated. An
    # argument marked dirty (ctx.mark_dirty) is returned as the same object, its autograd
    # history rebased onto the Function: the output is the argument's own tracker
    tx.output.mutation_epoch += 1
    given = [(e, tx.realize(a)) for e, a in zip([*ea, *ek.values()], [*args, *kwargs.values()])
             if isinstance(e, torch.Tensor)]
    return _wrap_outputs(tx, node, example, name, given)


def _wrap_outputs(tx, node, example, name: str, given=()) -> VariableTracker:
    """The trackers of apply's result: a tensor, or a tuple/list whose items are tensors
    (read from the node with getitem) and constants (None, numbers, strings, and tuples/lists
    of those; eager's apply passes them through unchanged, so they are the fake run's).
    `given`: (fake, tracker) of the arguments; an output that IS one (a dirty input) is that
    argument's tracker, so `is` holds and later uses read the written tensor."""
    for fake, tracker in given:
        if example is fake:
            node.meta["example_value"] = example
            return tracker
    if isinstance(example, torch.Tensor):
        return wrap_graph_value(tx, node, example, name)
    if type(example) not in (tuple, list) or not any(
            isinstance(v, torch.Tensor) for v in example):
        unsupported(f"{name} returned a {type(example).__name__} (only tensors and tuples or "
                    f"lists holding tensors are captured)", BreakReason.UNSUPPORTED_TYPE)
    node.meta["example_value"] = example
    items = []
    for i, v in enumerate(example):
        same = [t for fake, t in given if v is fake]
        if same:
            items.append(same[0])
        elif isinstance(v, torch.Tensor):
            item = tx.output.create_node("call_function", operator.getitem, (node, i), {})
            items.append(wrap_graph_value(tx, item, v, name))
        else:
            items.append(_constant_output(name, v))
    return ListVariable.new(items) if type(example) is list else TupleVariable(items=tuple(items))


def _constant_output(name: str, value) -> VariableTracker:
    if type(value) in (tuple, list):
        items = [_constant_output(name, v) for v in value]
        return ListVariable.new(items) if type(value) is list else \
            TupleVariable(items=tuple(items))
    if not is_constant_value(value):
        unsupported(f"{name} returned a {type(value).__name__} beside its tensors",
                    BreakReason.UNSUPPORTED_TYPE)
    return ConstantVariable(value=value)


def _bind(tx, cls: type, cls_source: Source | None, args: list, kwargs: dict) -> list:
    """The arguments eager's apply hands to forward (and to setup_context's `inputs`), bound
    by forward's `__code__` as apply does. Old-style forward(ctx, ...): keyword arguments fill
    the positions after the positional ones, with no gap (defaults are not applied). A
    forward with setup_context: every parameter bound, defaults applied. Refuses what apply
    would reject (apply raises TypeError) and shapes not modelled (keyword-only or **kwargs
    parameters, keywords beside *args)."""
    new_style = cls.setup_context is not _BASE_SETUP_CONTEXT
    if not kwargs and not new_style:
        return args
    name = f"{cls.__name__}.apply"
    fn = _static_function(cls, "forward", classmethods=True)
    code = fn.__code__
    first = 0 if new_style else 1  # as apply: a classmethod's `cls` is not skipped
    names = code.co_varnames[first:code.co_argcount]
    varargs = bool(code.co_flags & inspect.CO_VARARGS)
    if code.co_kwonlyargcount or code.co_flags & inspect.CO_VARKEYWORDS or \
            (varargs and kwargs):
        unsupported(f"{name}: binding keyword arguments to a forward with keyword-only, *args "
                    f"or **kwargs parameters", BreakReason.UNSUPPORTED_CALL)
    if len(args) > len(names) and not varargs:
        unsupported(f"{name}: too many arguments for forward", BreakReason.UNSUPPORTED_CALL)
    for k in kwargs:
        if k not in names or names.index(k) < len(args):
            unsupported(f"{name}: keyword argument {k!r} that forward cannot bind",
                        BreakReason.UNSUPPORTED_CALL)
    end = len(names) if new_style else \
        max((names.index(k) + 1 for k in kwargs), default=len(args))
    defaults = fn.__defaults__ or ()
    first_default = code.co_argcount - first - len(defaults)
    bound, used_default = list(args), False
    for i in range(len(args), end):
        if names[i] in kwargs:
            bound.append(kwargs[names[i]])
        elif new_style and i >= first_default and is_constant_value(defaults[i - first_default]):
            bound.append(ConstantVariable(value=defaults[i - first_default]))
            used_default = True
        else:
            unsupported(f"{name}: forward's parameter {names[i]!r} left unbound (or bound to a "
                        f"non-constant default)", BreakReason.UNSUPPORTED_CALL)
    if used_default:
        if not is_constant_value(defaults):
            unsupported(f"{name}: forward's defaults are not constants",
                        BreakReason.UNSUPPORTED_CALL)
        tx.output.install_guard(AttrSource(AttrSource(cls_source, "forward"), "__defaults__"),
                                GuardKind.EQUALS, defaults)
    return bound


def _apply_target(cls: type, writes: bool = False):
    """The node's target: a Python function calling `cls.apply` (torch.fx names a target by
    its module, which a bound C method lacks). Like any compiled graph's callees in
    torch.compile, forward runs without frame capture."""
    from ferrodyn.eval_frame import _set_eval_frame as set_eval_frame

    def apply(*args, **kwargs):
        prior = set_eval_frame(None)
        try:
            return cls.apply(*args, **kwargs)
        finally:
            set_eval_frame(prior)
    # a Function whose forward writes to its arguments: its name ends in "_" like every
    # in-place target, so the graph's input-mutation check (OutputGraph._writes_input) counts it
    apply.__name__ = apply.__qualname__ = f"{cls.__name__}_apply" + ("_" if writes else "")
    apply.__module__ = __name__
    apply.autograd_function = cls
    return apply


def _static_function(cls: type, name: str, classmethods: bool = False):
    """The plain Python function behind the staticmethod `cls.name` (or, when `classmethods`,
    the classmethod: it then takes `cls` first, see `_is_classmethod`), else None."""
    kinds = (staticmethod, classmethod) if classmethods else staticmethod
    for klass in cls.__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if isinstance(attr, kinds) and isinstance(attr.__func__, types.FunctionType):
                return attr.__func__
            return None
    return None


def _is_classmethod(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return isinstance(klass.__dict__[name], classmethod)
    return False


def _check_class(tx, cls: type, cls_source: Source | None) -> None:
    name = cls.__name__
    if type(cls) is not torch.autograd.function.FunctionMeta:
        unsupported(f"{name}: a custom metaclass of an autograd Function",
                    BreakReason.UNSUPPORTED_CALL)
    if cls.vmap is not _BASE_VMAP or getattr(cls, "generate_vmap_rule", False):
        unsupported(f"{name}: an autograd Function with a vmap rule", BreakReason.UNSUPPORTED_CALL)
    for attr in ("forward", "backward"):
        if _static_function(cls, attr, classmethods=True) is None:
            unsupported(f"{name}.{attr} is not a plain static or class Python function",
                        BreakReason.UNSUPPORTED_CALL)
    for attr, base in (("setup_context", _BASE_SETUP_CONTEXT), ("jvp", _BASE_JVP)):
        fn = getattr(cls, attr)
        if fn is not base and _static_function(cls, attr) is None:
            unsupported(f"{name}.{attr} is not a plain static Python function",
                        BreakReason.UNSUPPORTED_CALL)
    if cls_source is not None:  # what apply calls: guard that it stays the same
        for attr in ("forward", "backward", "setup_context", "jvp", "vmap"):
            if _is_classmethod(cls, attr):  # a new bound method per read: guard its function
                tx.output.install_guard(AttrSource(AttrSource(cls_source, attr), "__func__"),
                                        GuardKind.ID_MATCH, getattr(cls, attr).__func__)
                tx.output.install_guard(AttrSource(AttrSource(cls_source, attr), "__self__"),
                                        GuardKind.ID_MATCH, cls)
            else:
                tx.output.install_guard(AttrSource(cls_source, attr), GuardKind.ID_MATCH,
                                        getattr(cls, attr))


def _check_arg(tx, name: str, a: VariableTracker) -> None:
    if isinstance(a, TensorVariable):
        if a.cls not in _PLAIN_TENSOR_TYPES:
            unsupported(f"{name} on a tensor subclass", BreakReason.UNSUPPORTED_TYPE)
        return
    if isinstance(a, ConstantVariable):
        return
    if isinstance(a, (TupleVariable, ListVariable)) and type(a) in (TupleVariable, ListVariable):
        for item in a.unpack(tx):
            _check_arg(tx, name, tx.realize(item))
        return
    if _plain_dict(a):  # a config dict (transformers' yoso): str/number keys
        for v in a.state.items.values():
            _check_arg(tx, name, tx.realize(v))
        return
    unsupported(f"{name} with an argument of type {a.describe()} (only tensors, constants and "
                f"tuples/lists/dicts of those)", BreakReason.UNSUPPORTED_TYPE)


def _plain_dict(a: VariableTracker) -> bool:
    """An exact dict (not a subclass, not a read-only view) keyed by constants. The node passes
    apply a new dict of the same items (guarded); forward must leave it unchanged."""
    from ferrodyn.variables.dicts import DictVariable
    return (type(a) is DictVariable and a.state.cls is dict and not a.state.read_only
            and all(is_constant_value(k) for k in a.state.items))


# ---- speculation -------------------------------------------------------------------------------

class _SpeculationGraph(OutputGraph):
    """A throwaway graph for tracing a Function's forward/backward: the caller's fake mode and
    shape record, its own SideEffects and guards; it refuses new graph inputs."""

    def __init__(self, parent: OutputGraph):
        super().__init__(parent.f_globals, parent.f_builtins)
        self.fake_mode = parent.fake_mode
        self.shape_record = parent.shape_record
        self.bound_symbols = parent.bound_symbols

    def add_graph_input(self, source, value):
        unsupported(f"a custom autograd Function reads the tensor {source.name()} (not an "
                    f"argument)", BreakReason.UNSUPPORTED_CALL)

    def add_symint_input(self, source, value):
        unsupported(f"a custom autograd Function reads the int {source.name()} as a dynamic "
                    f"size", BreakReason.UNSUPPORTED_CALL)

    def stand_in(self, example: torch.Tensor, requires_grad: bool, cls: type) -> TensorVariable:
        with self.fake_mode:
            twin = example.detach()
            if requires_grad:
                twin.requires_grad_(True)
        node = self.graph.placeholder(f"arg{len(self._placeholders)}")
        node.meta["example_value"] = twin
        self._placeholders.append(node)
        return TensorVariable(node=node, example=twin, cls=cls)


def _stand_ins(tx, spec: _SpeculationGraph, a: VariableTracker, memo: dict,
               lists: list) -> VariableTracker:
    """Fresh trackers for the speculation: tensors -> detached fake twins (same metadata and
    requires_grad; one twin per tensor, so `is` holds), constants, tuples, and lists as new
    lists (`lists` gets (original, stand-in) to check that forward left them unchanged)."""
    a = tx.realize(a)
    if isinstance(a, TensorVariable):
        key = a.identity()
        if key not in memo:
            memo[key] = spec.stand_in(a.example, a.example.requires_grad, a.cls)
        return memo[key]
    if isinstance(a, ConstantVariable):
        return ConstantVariable(value=a.value)
    if _plain_dict(a):
        from ferrodyn.variables.dicts import DictVariable
        values = {k: _stand_ins(tx, spec, v, memo, lists) for k, v in a.state.items.items()}
        new = DictVariable.new(values)
        lists.append((values, new))
        return new
    items = [_stand_ins(tx, spec, i, memo, lists) for i in a.unpack(tx)]
    if isinstance(a, TupleVariable):
        return TupleVariable(items=tuple(items))
    new = ListVariable.new(items)
    lists.append((items, new))
    return new


def _speculate(tx, cls: type, cls_source: Source | None, args: list) -> bool:
    """Trace forward (+ setup_context) and backward into a throwaway graph; refuse on any
    effect outside the Function. Copies the guards it installed to the caller's graph."""
    from ferrodyn.symbolic.translator import InstructionTranslator
    from ferrodyn.variables.functions import UserFunctionVariable
    name = f"{cls.__name__}.apply"
    spec = _SpeculationGraph(tx.output)
    grad = torch.is_grad_enabled()
    try:
        memo: dict = {}
        lists: list = []
        inputs = [_stand_ins(tx, spec, a, memo, lists) for a in args]
        # as eager: whether each argument is a tensor that requires grad (grad mode aside)
        needs = tuple(bool(isinstance(a, TensorVariable) and a.example.requires_grad)
                      for a in args)
        ctx = FunctionCtxVariable(state=_CtxState(
            needs_input_grad=needs,
            inputs=tuple(i for i in inputs if isinstance(i, TensorVariable))))

        def fn_var(attr):
            from ferrodyn.variables.user_objects import ClassVariable
            src = AttrSource(cls_source, attr) if cls_source is not None else None
            if _is_classmethod(cls, attr):  # forward(cls, ctx, ...): cls bound first
                return _BoundToClass(fn=UserFunctionVariable(
                    source=AttrSource(src, "__func__") if src is not None else None,
                    fn=getattr(cls, attr).__func__), cls=ClassVariable(source=cls_source,
                                                                       value=cls))
            return UserFunctionVariable(source=src, fn=getattr(cls, attr))

        forward = fn_var("forward")
        code_of = forward.fn.fn if isinstance(forward, _BoundToClass) else forward.fn
        stx = InstructionTranslator(code_of.__code__, code_of.__globals__, spec, {}, {},
                                    lambda n: None)
        torch._C._set_grad_enabled(False)
        if cls.setup_context is not _BASE_SETUP_CONTEXT:
            out = stx.realize(forward.call_function(stx, inputs, {}))
            fn_var("setup_context").call_function(
                stx, [ctx, TupleVariable(items=tuple(inputs)), out], {})
        else:
            out = stx.realize(forward.call_function(stx, [ctx, *inputs], {}))
        outs = _output_tensors(name, stx, out)
        if spec.side_effects.has_effects:
            unsupported(f"{cls.__name__}.forward has side effects", BreakReason.SIDE_EFFECT)
        writes = _writes_to_input(spec)
        grads = []
        for o in outs:
            if o is None:
                grads.append(ConstantVariable(value=None))
                continue
            with spec.fake_mode:
                g = torch.zeros_like(o.example).detach()
            node = spec.graph.placeholder(f"grad{len(grads)}")
            node.meta["example_value"] = g
            grads.append(TensorVariable(node=node, example=g, cls=torch.Tensor))
        ctx.state.in_backward = True
        fn_var("backward").call_function(stx, [ctx, *grads], {})
        if spec.side_effects.has_effects:
            unsupported(f"{cls.__name__}.backward has side effects", BreakReason.SIDE_EFFECT)
        for items, new in lists:
            now = new.state.items
            if isinstance(items, dict):  # a dict argument: same keys, in order, same values
                same = list(now) == list(items) and all(now[k] is v for k, v in items.items())
            else:
                same = len(now) == len(items) and all(x is y for x, y in zip(now, items))
            if not same:
                unsupported(f"{cls.__name__} mutates a list or dict argument",
                            BreakReason.SIDE_EFFECT)
    except Unsupported as e:
        # the break happens at the caller's `apply` call: no path into the speculation
        raise Unsupported(f"{name}: {e.construct}", BreakReason.UNSUPPORTED_CALL) from None
    except Exception as e:  # a traced exception escaping forward/backward
        raise Unsupported(f"{name}: {type(e).__name__} while tracing: {e}",
                          BreakReason.UNSUPPORTED_CALL) from None
    finally:
        spec.close()
        torch._C._set_grad_enabled(grad)
    for g in spec.guards.values():
        tx.output.guards.setdefault(g, g)
    return writes or bool(ctx.state.dirty)  # a dirty argument is returned as itself


def _writes_to_input(spec: _SpeculationGraph) -> bool:
    """Whether an in-place op of forward writes to the storage of an argument. Only the
    tensors an op writes count (its self / first argument, `out=`), not every tensor it
    reads (`out += bias.expand_as(out)` reads an argument and writes a fresh tensor). Refuses
    a write to something that is not a traced tensor (the check cannot place it)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from ferrodyn.variables.tensor import _is_inplace
    if spec.mutation_epoch == 0:
        return False
    inputs = spec._input_storages()

    def written(node):
        if node.op not in ("call_function", "call_method") or not node.args:
            return []
        out = []
        if _is_inplace(node.op, node.target) or node.kwargs.get("inplace") is True:
            out.append(node.args[0])
        if "out" in node.kwargs:
            out.append(node.kwargs["out"])
        flat = []
        for o in out:
            flat.extend(o if isinstance(o, (tuple, list)) else [o])
        return flat

    for node in spec.graph.nodes:
        for arg in written(node):
            ex = arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None
            if not isinstance(ex, torch.Tensor):
                unsupported(f"an in-place {node.target} on a value that is not a tensor",
                            BreakReason.UNSUPPORTED_CALL)
            if StorageWeakRef(ex.untyped_storage()) in inputs:
                return True
    return False


def _output_tensors(name: str, tx, out: VariableTracker) -> list[TensorVariable | None]:
    """forward's outputs as backward sees them: a tensor each, None for a constant output
    (autograd gives a non-tensor output no gradient)."""
    if isinstance(out, TensorVariable):
        return [out]
    if isinstance(out, (TupleVariable, ListVariable)):
        items = [tx.realize(i) for i in out.unpack(tx)]
        if any(isinstance(i, TensorVariable) for i in items) and \
                all(isinstance(i, TensorVariable) or _is_constant_tracker(tx, i) for i in items):
            return [i if isinstance(i, TensorVariable) else None for i in items]
    unsupported(f"{name}: forward returned {out.describe()} (only tensors and tuples or lists "
                f"of tensors and constants are captured)", BreakReason.UNSUPPORTED_TYPE)


def _is_constant_tracker(tx, v: VariableTracker) -> bool:
    v = tx.realize(v)
    if isinstance(v, ConstantVariable):
        return True
    if type(v) in (TupleVariable, ListVariable):
        return all(_is_constant_tracker(tx, i) for i in v.unpack(tx))
    return False


@dataclass(frozen=True, eq=False)
class _BoundToClass(VariableTracker):
    """A classmethod forward/backward of the Function: `fn` called with `cls` first."""

    fn: VariableTracker = None  # type: ignore[assignment]
    cls: VariableTracker = None  # type: ignore[assignment]

    def call_function(self, tx, args, kwargs):
        return self.fn.call_function(tx, [self.cls, *args], kwargs)


# ---- ctx --------------------------------------------------------------------------------------

@dataclass
class _CtxState:
    needs_input_grad: tuple = ()
    attrs: dict = field(default_factory=dict)
    saved: tuple | None = None
    in_backward: bool = False
    inputs: tuple = ()  # the stand-ins forward received
    dirty: list = field(default_factory=list)  # the inputs marked dirty


@dataclass(frozen=True, eq=False)
class FunctionCtxVariable(VariableTracker):
    """The `ctx` of a speculated Function: attributes stored on it, saved tensors,
    `needs_input_grad`; the methods that change autograd's view of the outputs are modelled
    (`mark_non_differentiable`, `set_materialize_grads`) and `mark_dirty` (arguments only)."""

    state: _CtxState = None  # type: ignore[assignment]

    def describe(self):
        return "autograd Function ctx"

    def var_getattr(self, tx, name):
        if name in _CTX_METHODS:
            return _CtxMethod(ctx=self, name=name)
        if name == "saved_tensors":
            if self.state.saved is None:
                unsupported("ctx.saved_tensors before save_for_backward",
                            BreakReason.UNSUPPORTED_CALL)
            return TupleVariable(items=self.state.saved)
        if name == "needs_input_grad":
            return TupleVariable(items=tuple(ConstantVariable(value=b)
                                             for b in self.state.needs_input_grad))
        if name in self.state.attrs:
            return self.state.attrs[name]
        unsupported(f"attribute {name!r} of an autograd Function ctx",
                    BreakReason.UNSUPPORTED_CALL)

    def has_attr(self, tx, name):
        return name in _CTX_METHODS or name in self.state.attrs or name == "needs_input_grad" \
            or (name == "saved_tensors" and self.state.saved is not None)

    def setattr(self, tx, name, value):
        # the ctx is an instance of Cls._backward_cls (a BackwardCFunction): a store over
        # one of its class attributes (or a dunder) is autograd's business; any other name,
        # private ones too (torch.amp.custom_fwd stores ctx._dtype), is a plain attribute
        if name in _CTX_METHODS or name in _CTX_CLASS_ATTRS or \
                (name.startswith("__") and name.endswith("__")) or \
                hasattr(torch.autograd.function.BackwardCFunction, name):
            unsupported(f"store of ctx.{name} (an autograd attribute)",
                        BreakReason.UNSUPPORTED_CALL)
        self.state.attrs[name] = value


_CTX_CLASS_ATTRS = ("saved_tensors", "needs_input_grad", "_forward_cls", "_autograd_function_id")


def _save_for_backward(tx, ctx, args):
    items = []
    for a in args:
        a = tx.realize(a)
        if not (isinstance(a, TensorVariable) or
                isinstance(a, ConstantVariable) and a.value is None):
            unsupported(f"ctx.save_for_backward of {a.describe()}", BreakReason.UNSUPPORTED_CALL)
        items.append(a)
    ctx.state.saved = tuple(items)


def _mark_dirty(tx, ctx, args):
    """Only tensor arguments of forward may be marked dirty (others refused)."""
    for a in args:
        a = tx.realize(a)
        if not isinstance(a, TensorVariable) or \
                not any(a.node is i.node for i in ctx.state.inputs):
            unsupported("ctx.mark_dirty of a tensor that is not an argument",
                        BreakReason.UNSUPPORTED_CALL)
        ctx.state.dirty.append(a)


def _mark_non_differentiable(tx, ctx, args):
    for a in args:
        if not isinstance(tx.realize(a), TensorVariable):
            unsupported("ctx.mark_non_differentiable of a non-tensor",
                        BreakReason.UNSUPPORTED_CALL)


def _set_materialize_grads(tx, ctx, args):
    if len(args) != 1 or not tx.realize(args[0]).is_python_constant():
        unsupported("ctx.set_materialize_grads with a non-constant", BreakReason.UNSUPPORTED_CALL)


def _refuse(what):
    def handler(tx, ctx, args):
        unsupported(f"ctx.{what} (in-place or forward-AD autograd Functions are not captured)",
                    BreakReason.UNSUPPORTED_CALL)
    return handler


def _in_forward(handler):
    def checked(tx, ctx, args):
        if ctx.state.in_backward:
            unsupported("ctx method called in backward", BreakReason.UNSUPPORTED_CALL)
        return handler(tx, ctx, args)
    return checked


_CTX_METHODS = {
    "save_for_backward": _in_forward(_save_for_backward),
    "mark_non_differentiable": _in_forward(_mark_non_differentiable),
    "set_materialize_grads": _in_forward(_set_materialize_grads),
    "mark_dirty": _in_forward(_mark_dirty),
    "save_for_forward": _refuse("save_for_forward"),
}


@dataclass(frozen=True, eq=False)
class _CtxMethod(VariableTracker):
    ctx: FunctionCtxVariable = None  # type: ignore[assignment]
    name: str = ""

    def describe(self):
        return f"ctx.{self.name}"

    def call_function(self, tx, args, kwargs):
        if kwargs:
            unsupported(f"ctx.{self.name} with keyword arguments", BreakReason.UNSUPPORTED_CALL)
        _CTX_METHODS[self.name](tx, self.ctx, list(args))
        return ConstantVariable(value=None)

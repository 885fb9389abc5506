"""Context managers that change torch's global state: `torch.no_grad`, `torch.enable_grad`,
`torch.set_grad_enabled`, `torch.autocast` / `torch.cpu.amp.autocast`.

Owns recording them into the graph the way TorchDynamo does: entering and leaving become
`torch._C._set_grad_enabled(mode)` / `torch.amp._enter_autocast(...)` and
`torch.amp._exit_autocast(ctx)` nodes around the ops, so the backend sees the state changes;
the same state is also set for real while tracing (fake execution then computes the right
`requires_grad` and dtypes) and restored by the output graph if the trace is abandoned.
Does not own the generic `with` protocol (opcodes_control.py calls `__enter__`/`__exit__`).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable


def set_grad_mode(tx, mode: bool) -> None:
    tx.output.create_node("call_function", torch._C._set_grad_enabled, (mode,), {})
    torch._C._set_grad_enabled(mode)


@dataclass
class CtxState:
    prev: Any = None
    entered: bool = False
    real: Any = None
    node: Any = None


class CtxMethodsMixin:
    """`ctx.__enter__` / `ctx.__exit__` read off a context-manager tracker: a bound method whose
    call lands in the tracker's own `call_method` (shared by every tracker whose enter and exit
    are modelled there; other attributes go to the next class in the MRO)."""

    def var_getattr(self, tx, name):
        if name in ("__enter__", "__exit__"):
            from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        return super().var_getattr(tx, name)


@dataclass(frozen=True, eq=False)
class GradModeVariable(CtxMethodsMixin, VariableTracker):
    """`torch.no_grad()` (mode False) / `torch.enable_grad()` (True) / `set_grad_enabled(m)`.
    `eager_set`: set_grad_enabled changes the mode when constructed, not on enter."""

    mode: bool = False
    eager_set: bool = False
    state: CtxState = field(default_factory=CtxState)

    @staticmethod
    def create(tx, mode: bool, eager_set: bool = False) -> "GradModeVariable":
        var = GradModeVariable(mode=mode, eager_set=eager_set, state=CtxState())
        if eager_set:
            var.state.prev = torch.is_grad_enabled()
            set_grad_mode(tx, mode)
        return var

    def describe(self):
        return f"grad mode context ({self.mode})"

    def python_type(self):
        if self.eager_set:
            return torch.set_grad_enabled
        return torch.enable_grad if self.mode else torch.no_grad

    def var_getattr(self, tx, name):
        from ferrodyn.variables.functions import BoundMethodVariable, UserFunctionVariable
        if name in ("__enter__", "__exit__"):
            return super().var_getattr(tx, name)
        if name == "__class__":
            from ferrodyn.variables.builder import build_unsourced
            return build_unsourced(self.python_type())
        if name in ("mode", "prev") and self.eager_set:  # fixed when set_grad_enabled is made
            return ConstantVariable(value=self.mode if name == "mode" else self.state.prev)
        # torch's decorator wrappers call `ctx.clone()`: inlined on this tracker
        fn = getattr(self.python_type(), name, None)
        if name == "clone" and isinstance(fn, types.FunctionType):
            return BoundMethodVariable(func=UserFunctionVariable(fn=fn), obj=self)
        return super().var_getattr(tx, name)

    def has_attr(self, tx, name):
        if name in ("mode", "prev") and not self.eager_set:  # instance state: not modelled
            unsupported(f"hasattr({self.describe()}, {name!r})", BreakReason.UNSUPPORTED_TYPE)
        return name in ("mode", "prev") or hasattr(self.python_type(), name)

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__" and self.source is not None and not self.eager_set:
            # eager sets the object's `prev`, which outlives the frame: not modelled
            unsupported(f"entering a {self.describe()} object made outside the frame",
                        BreakReason.UNSUPPORTED_CALL)
        if name == "__enter__":
            if not self.eager_set:
                self.state.prev = torch.is_grad_enabled()
                set_grad_mode(tx, self.mode)
            self.state.entered = True
            return ConstantVariable(value=None)
        if name == "__exit__":
            set_grad_mode(tx, self.state.prev)
            return ConstantVariable(value=False)
        unsupported(f"{self.describe()}.{name}", BreakReason.UNSUPPORTED_CALL)

    def call_function(self, tx, args, kwargs):
        """Used as a decorator (`torch.no_grad()(fn)`, `set_grad_enabled(m)(fn)`): torch's
        `_DecoratorContextManager.__call__` returns a wrapper that runs `fn` inside a clone of
        this context (`set_grad_enabled.__call__` first puts back the mode its constructor
        changed). Only a plain Python function is wrapped here (a class or a generator
        function, wrapped differently by torch, is refused)."""
        from ferrodyn.variables.functions import InlinableFunction
        fn = tx.realize(args[0]) if len(args) == 1 and not kwargs else None
        if not isinstance(fn, InlinableFunction) or fn.code().co_flags & _GEN_FLAGS:
            unsupported("grad-mode context manager used as a decorator of "
                        f"{fn.describe() if fn is not None else 'these arguments'}",
                        BreakReason.UNSUPPORTED_CALL)
        if self.eager_set:
            set_grad_mode(tx, self.state.prev)
        return GradWrappedFunction(mode=self.mode, fn=fn)

    def reconstruct(self, tx):
        """The object itself (returned, or live at a graph break): made again without running
        its constructor (set_grad_enabled's would switch the mode), with the `prev` it holds."""
        if self.source is not None:
            return super().reconstruct(tx)
        from ferrodyn.trace_result import OutCall, OutConst
        if not self.eager_set:
            # a no_grad/enable_grad object in a resume function would be called as a
            # decorator there (refused: one break after another); the frame runs eagerly
            unsupported(f"rebuilding {self.describe()}", BreakReason.UNSUPPORTED_TYPE)
        prev = self.state.prev
        return OutCall(rebuild_grad_ctx, (OutConst(self.python_type()), OutConst(self.mode),
                                          OutConst(bool(prev))))


_GEN_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


@dataclass(frozen=True, eq=False)
class GradWrappedFunction(VariableTracker):
    """What a grad-mode context used as a decorator returns (torch's `decorate_context`):
    calling it sets the mode, runs `fn` inlined and restores the mode it found, also when `fn`
    raises (the exception then goes on). Its functools.wraps attributes are not modelled and
    it does not leave the frame (no reconstruction)."""

    mode: bool = False
    fn: VariableTracker = None  # type: ignore[assignment]

    def describe(self):
        return f"function wrapped in grad mode {self.mode}"

    def python_type(self):
        return types.FunctionType

    def call_function(self, tx, args, kwargs):
        from ferrodyn.variables.exceptions import TracedException
        prev = torch.is_grad_enabled()
        set_grad_mode(tx, self.mode)
        try:
            result = self.fn.call_function(tx, list(args), dict(kwargs))
        except TracedException:
            set_grad_mode(tx, prev)
            raise
        set_grad_mode(tx, prev)
        return result

    def var_getattr(self, tx, name):
        unsupported(f"attribute {name!r} of a {self.describe()}", BreakReason.UNSUPPORTED_TYPE)

    def reconstruct(self, tx):
        unsupported(f"a {self.describe()} leaving the frame", BreakReason.UNSUPPORTED_TYPE)


def rebuild_grad_ctx(cls, mode: bool, prev: bool):
    """A `torch.no_grad` / `enable_grad` / `set_grad_enabled` object holding `prev` (what its
    `__exit__` restores), made without its constructor."""
    obj = cls.__new__(cls)
    obj.prev = prev
    if cls is torch.set_grad_enabled:
        obj.mode = mode
    return obj


_GRAD_CTX_TYPES = {torch.no_grad: False, torch.enable_grad: True}


def build_grad_ctx(tx, value, source, guard) -> GradModeVariable | None:
    """The tracker of a real grad-mode context object reached from the frame (a resume
    function's local, an argument), guarded on its type and the attributes its methods read;
    None for other objects."""
    from ferrodyn.guard_spec import GuardKind
    from ferrodyn.source import AttrSource
    t = type(value)
    if t is not torch.set_grad_enabled:  # no_grad/enable_grad objects: user objects
        return None
    attrs = ("prev", "mode") if t is torch.set_grad_enabled else ("prev",)
    if any(type(getattr(value, a, None)) is not bool for a in attrs) or \
            set(vars(value)) != set(attrs):
        return None
    guard(tx, source, GuardKind.TYPE_MATCH, t)
    for a in attrs:
        guard(tx, AttrSource(source, a), GuardKind.TYPE_MATCH, bool)
        guard(tx, AttrSource(source, a), GuardKind.EQUALS, getattr(value, a))
    mode = value.mode if t is torch.set_grad_enabled else _GRAD_CTX_TYPES[t]
    return GradModeVariable(source=source, mode=mode, eager_set=t is torch.set_grad_enabled,
                            state=CtxState(prev=value.prev))


@dataclass(frozen=True, eq=False)
class AutocastVariable(CtxMethodsMixin, VariableTracker):
    """`torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)`."""

    args: tuple = ()
    state: CtxState = field(default_factory=CtxState)

    def describe(self):
        return f"autocast{self.args}"

    def python_type(self):
        return torch.amp.autocast

    def call_method(self, tx, name, args, kwargs):
        st = self.state
        if name == "__enter__":
            st.node = tx.output.create_node("call_function", torch.amp._enter_autocast,
                                            self.args, {})
            st.real = torch.autocast(*self.args)
            st.real.__enter__()
            real = st.real
            tx.output.restore_on_close(lambda: (not st.entered) or real.__exit__(None, None, None))
            st.entered = True
            return ConstantVariable(value=None)
        if name == "__exit__":
            tx.output.create_node("call_function", torch.amp._exit_autocast, (st.node,), {})
            st.real.__exit__(None, None, None)
            st.entered = False
            return ConstantVariable(value=False)
        unsupported(f"{self.describe()}.{name}", BreakReason.UNSUPPORTED_CALL)


def _consts(tx, args, kwargs, what):
    vals, kvals = [], {}
    for a in args:
        a = tx.realize(a)
        if not a.is_python_constant():
            unsupported(f"{what} with non-constant arguments", BreakReason.UNSUPPORTED_CALL)
        vals.append(a.as_python_constant())
    for k, v in kwargs.items():
        v = tx.realize(v)
        if not v.is_python_constant():
            unsupported(f"{what} with non-constant arguments", BreakReason.UNSUPPORTED_CALL)
        kvals[k] = v.as_python_constant()
    return vals, kvals


def _autocast(tx, args, kwargs):
    vals, kvals = _consts(tx, args, kwargs, "torch.autocast")
    import inspect
    sig = inspect.signature(torch.amp.autocast.__init__)
    bound = sig.bind(None, *vals, **kvals)
    bound.apply_defaults()
    a = bound.arguments
    return AutocastVariable(args=(a["device_type"], a["dtype"], a["enabled"], a["cache_enabled"]),
                            state=CtxState())


def _cpu_autocast(tx, args, kwargs):
    vals, kvals = _consts(tx, args, kwargs, "torch.cpu.amp.autocast")
    import inspect
    sig = inspect.signature(torch.cpu.amp.autocast.__init__)
    bound = sig.bind(None, *vals, **kvals)
    bound.apply_defaults()
    a = bound.arguments
    return AutocastVariable(args=("cpu", a["dtype"], a["enabled"], a["cache_enabled"]),
                            state=CtxState())


def _grad_mode_arg(tx, args, kwargs, what, kw="mode") -> bool:
    vals, kvals = _consts(tx, args, kwargs, what)
    if len(vals) + len(kvals) != 1 or (kvals and kw not in kvals):
        unsupported(f"TypeError: {what} takes one argument, {kw}", BreakReason.EXCEPTION)
    mode = kvals.get(kw, vals[0] if vals else None)
    if not isinstance(mode, bool):  # eager: TypeError for anything but a bool
        unsupported(f"TypeError: {what} of {type(mode).__name__}", BreakReason.EXCEPTION)
    return mode


def _no_param_ctx(tx, mode, args, kwargs):
    """`torch.no_grad()` / `enable_grad()`; with a function, `torch.no_grad(fn)` is the
    decorator form (`_NoParamDecoratorContextManager.__new__`: `cls()(fn)`)."""
    ctx = GradModeVariable.create(tx, mode)
    if args or kwargs:
        return ctx.call_function(tx, list(args), dict(kwargs))
    return ctx


def _set_grad_enabled(tx, args, kwargs):
    return GradModeVariable.create(tx, _grad_mode_arg(tx, args, kwargs, "torch.set_grad_enabled"),
                                   eager_set=True)


def _c_set_grad_enabled(tx, args, kwargs):
    """`torch._C._set_grad_enabled(mode)`: a plain function returning None (not a context)."""
    set_grad_mode(tx, _grad_mode_arg(tx, args, kwargs, "torch._C._set_grad_enabled", "enabled"))
    return ConstantVariable(value=None)


def _cuda_autocast(tx, args, kwargs):
    """`torch.cuda.amp.autocast(enabled, dtype, cache_enabled)`, i.e. `torch.autocast("cuda",
    ...)` (on a machine without CUDA both warn and stay disabled)."""
    vals, kvals = _consts(tx, args, kwargs, "torch.cuda.amp.autocast")
    import inspect
    sig = inspect.signature(torch.cuda.amp.autocast.__init__)
    try:
        bound = sig.bind(None, *vals, **kvals)
    except TypeError as e:
        unsupported(f"TypeError: torch.cuda.amp.autocast: {e}", BreakReason.EXCEPTION)
    bound.apply_defaults()
    a = bound.arguments
    return AutocastVariable(args=("cuda", a["dtype"], a["enabled"], a["cache_enabled"]),
                            state=CtxState())


CTX_MANAGER_HANDLERS = {
    torch.no_grad: lambda tx, args, kwargs: _no_param_ctx(tx, False, args, kwargs),
    torch.enable_grad: lambda tx, args, kwargs: _no_param_ctx(tx, True, args, kwargs),
    torch.set_grad_enabled: _set_grad_enabled,
    torch._C._set_grad_enabled: _c_set_grad_enabled,
    torch.autocast: _autocast,
    torch.amp.autocast: _autocast,
    torch.cpu.amp.autocast: _cpu_autocast,
    torch.cuda.amp.autocast: _cuda_autocast,
}

"""Context managers that switch one piece of torch's global state other than grad mode and
autocast: `torch.inference_mode(mode)`, `torch.nn.attention.sdpa_kernel(backends)`,
`torch.autograd.graph.disable_saved_tensors_hooks(message)`,
`torch._C.DisableTorchFunctionSubclass()` / `torch._C.DisableTorchFunction()`.

Owns `StateContextVariable` and the table `STATE_CTX_KINDS` saying, per kind, how the state
change is recorded into the graph and how the real context is made. As ctx_managers.py does
for autocast, entering records an enter node whose result is the previous state (so the
graph restores whatever state it was called under, never a value baked at trace time),
leaving records the matching exit node, and the real context is entered while tracing (fake
execution and folded queries such as `torch.is_inference_mode_enabled()` see the state) and
exited again by the output graph if the trace is abandoned. A `with` block of these that is
live at a graph break is exited at the end of the graph and re-entered by the entry and the
resume function (resume/capture.py's `AutocastReenter`, given this kind's factory).

Refused (the frame breaks or runs eagerly): non-constant arguments, `sdpa_kernel(...,
set_priority=True)`, disabling torch function while a torch function mode is active, a
context entered twice or exited before it was entered. Does not own grad mode / autocast
(ctx_managers.py), the ignored profiler contexts (profiler_ctx.py) or the `with` protocol
(symbolic/opcodes_control.py).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.ctx_managers import CtxMethodsMixin, CtxState, _consts


# ---- graph-side enter/exit of the state (each enter returns what its exit restores) ---------

def enter_sdpa_kernel(*backends: int) -> list:
    """The graph's `sdpa_kernel(backends)` enter (the backends as ints: an fx graph's code
    cannot spell the pybind enum): set the allowed backends, return the previous ones (for
    `exit_sdpa_kernel`)."""
    from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends, _sdpa_kernel
    prev = _cur_sdpa_kernel_backends()
    _sdpa_kernel([SDPBackend(b) for b in backends])
    return prev


def exit_sdpa_kernel(prev: list) -> None:
    from torch.nn.attention import _sdpa_kernel
    _sdpa_kernel(prev)


def enter_saved_tensors_hooks_disabled(message: str):
    """The graph's `disable_saved_tensors_hooks(message)` enter: returns the message it
    replaces (None: the hooks were enabled)."""
    prev = torch._C._autograd._saved_tensors_hooks_get_disabled_error_message()
    torch._C._autograd._saved_tensors_hooks_disable(message)
    return prev


def exit_saved_tensors_hooks_disabled(prev) -> None:
    if prev is None:
        torch._C._autograd._saved_tensors_hooks_enable()
    else:
        torch._C._autograd._saved_tensors_hooks_disable(prev)


@dataclass(frozen=True)
class StateKind:
    name: str
    factory: Any                           # what the resume function calls with `args` again
    make_real: Callable[..., Any]          # args -> the real context object
    enter_fn: Callable | None = None       # graph node on enter (None: the state is trace-only)
    exit_fn: Callable | None = None        # graph node on exit, given the enter node
    enter_result: Callable[[tuple], Any] = lambda args: None  # what `with ... as v` binds
    node_args: Callable[[tuple], tuple] = lambda args: args      # the enter node's arguments


@dataclass(frozen=True, eq=False)
class StateContextVariable(CtxMethodsMixin, VariableTracker):
    kind: StateKind = None  # type: ignore[assignment]
    args: tuple = ()
    state: CtxState = field(default_factory=CtxState)

    def python_type(self):
        import contextlib
        f = self.kind.factory  # a class, or a `contextlib.contextmanager` function
        return f if isinstance(f, type) else contextlib._GeneratorContextManager

    def identity(self):
        return self.state

    def describe(self):
        return f"{self.kind.name}{self.args} context"

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            return self.enter(tx)
        if name == "__exit__":
            self.exit(tx)
            return ConstantVariable(value=False)
        unsupported(f"{self.describe()}.{name}", BreakReason.UNSUPPORTED_CALL)

    def enter(self, tx) -> VariableTracker:
        st, kind = self.state, self.kind
        if st.entered or st.real is not None:
            unsupported(f"{self.describe()} entered twice", BreakReason.UNSUPPORTED_CALL)
        if kind.enter_fn is not None:
            st.node = tx.output.create_node("call_function", kind.enter_fn,
                                            kind.node_args(self.args), {})
        real = kind.make_real(*self.args)
        real.__enter__()
        st.real, st.entered = real, True
        tx.output.restore_on_close(lambda: (not st.entered) or real.__exit__(None, None, None))
        return ConstantVariable(value=kind.enter_result(self.args))

    def exit(self, tx) -> None:
        """Leave it (also at a graph break inside the `with` block: `exit_at_break`)."""
        st, kind = self.state, self.kind
        if not st.entered:
            unsupported(f"{self.describe()} exited before it was entered",
                        BreakReason.UNSUPPORTED_CALL)
        if kind.exit_fn is not None:
            tx.output.create_node("call_function", kind.exit_fn, (st.node,), {})
        st.real.__exit__(None, None, None)
        st.entered = False

    exit_at_break = exit

    def reenter(self):
        """What stands for this live `with` block's `__exit__` across a graph break."""
        from ferrodyn.resume.capture import AutocastReenter
        return AutocastReenter(tuple(self.args), make=self.kind.factory)


# ---- the kinds and their constructors ---------------------------------------------------------

def _bind(fn, tx, args, kwargs, what):
    vals, kvals = _consts(tx, args, kwargs, what)
    try:
        bound = inspect.signature(fn).bind(*vals, **kvals)
    except TypeError as e:
        unsupported(f"TypeError: {what}: {e}", BreakReason.EXCEPTION)
    bound.apply_defaults()
    return bound.arguments


def _inference_mode(tx, args, kwargs):
    a = _bind(lambda mode=True: None, tx, args, kwargs, "torch.inference_mode")
    return StateContextVariable(kind=_INFERENCE, args=(bool(a["mode"]),), state=CtxState())


def _sdpa_kernel(tx, args, kwargs):
    from torch.nn.attention import SDPBackend
    from ferrodyn.variables.lists import ListVariable
    if args and isinstance(tx.realize(args[0]), ListVariable):  # a list of constants
        items = tx.realize(args[0]).unpack(tx)
        args = [ConstantVariable(value=[tx.realize(i).as_python_constant() for i in items]
                                 if all(tx.realize(i).is_python_constant() for i in items)
                                 else None), *args[1:]]
    a = _bind(lambda backends, set_priority=False: None, tx, args, kwargs,
              "torch.nn.attention.sdpa_kernel")
    backends = a["backends"]
    if a["set_priority"]:
        unsupported("sdpa_kernel(..., set_priority=True)", BreakReason.UNSUPPORTED_CALL)
    if isinstance(backends, SDPBackend):
        backends = [backends]
    if not isinstance(backends, list) or not all(isinstance(b, SDPBackend) for b in backends):
        unsupported("AssertionError: sdpa_kernel backends must be SDPBackend values",
                    BreakReason.EXCEPTION)
    return StateContextVariable(kind=_SDPA, args=(list(dict.fromkeys(backends)),),
                                state=CtxState())


def _disable_saved_tensors_hooks(tx, args, kwargs):
    a = _bind(lambda error_message: None, tx, args, kwargs,
              "torch.autograd.graph.disable_saved_tensors_hooks")
    if not isinstance(a["error_message"], str):
        unsupported("disable_saved_tensors_hooks of a non-string message",
                    BreakReason.UNSUPPORTED_CALL)
    return StateContextVariable(kind=_SAVED_HOOKS, args=(a["error_message"],), state=CtxState())


def _disable_torch_function(kind):
    def handler(tx, args, kwargs):
        if args or kwargs:
            unsupported(f"TypeError: {kind.name}() takes no arguments", BreakReason.EXCEPTION)
        if torch._C._len_torch_function_stack() > 0:
            unsupported(f"{kind.name} under an active torch function mode",
                        BreakReason.UNSUPPORTED_CALL)
        return StateContextVariable(kind=kind, args=(), state=CtxState())
    return handler


_INFERENCE = StateKind(
    name="torch.inference_mode", factory=torch.inference_mode, make_real=torch.inference_mode,
    enter_fn=torch.autograd.grad_mode._enter_inference_mode,
    exit_fn=torch.autograd.grad_mode._exit_inference_mode)
_SDPA = StateKind(
    name="torch.nn.attention.sdpa_kernel", factory=torch.nn.attention.sdpa_kernel,
    make_real=torch.nn.attention.sdpa_kernel, enter_fn=enter_sdpa_kernel,
    exit_fn=exit_sdpa_kernel, enter_result=lambda args: {},
    node_args=lambda args: tuple(int(b) for b in args[0]))
_SAVED_HOOKS = StateKind(
    name="torch.autograd.graph.disable_saved_tensors_hooks",
    factory=torch.autograd.graph.disable_saved_tensors_hooks,
    make_real=torch.autograd.graph.disable_saved_tensors_hooks,
    enter_fn=enter_saved_tensors_hooks_disabled, exit_fn=exit_saved_tensors_hooks_disabled)
# Disabling torch function changes nothing for the plain tensors a graph holds (subclasses
# and modes are refused), so it lives only while tracing: no graph node.
_DISABLE_TF_SUBCLASS = StateKind(
    name="torch._C.DisableTorchFunctionSubclass", factory=torch._C.DisableTorchFunctionSubclass,
    make_real=torch._C.DisableTorchFunctionSubclass)
_DISABLE_TF = StateKind(
    name="torch._C.DisableTorchFunction", factory=torch._C.DisableTorchFunction,
    make_real=torch._C.DisableTorchFunction)

STATE_CTX_KINDS = (_INFERENCE, _SDPA, _SAVED_HOOKS, _DISABLE_TF_SUBCLASS, _DISABLE_TF)

STATE_CTX_HANDLERS = {
    torch.inference_mode: _inference_mode,
    torch.autograd.grad_mode.inference_mode: _inference_mode,
    torch.nn.attention.sdpa_kernel: _sdpa_kernel,
    torch.autograd.graph.disable_saved_tensors_hooks: _disable_saved_tensors_hooks,
    torch._C.DisableTorchFunctionSubclass: _disable_torch_function(_DISABLE_TF_SUBCLASS),
    torch._C.DisableTorchFunction: _disable_torch_function(_DISABLE_TF),
}

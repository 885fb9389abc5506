"""The proxy dispatch mode: records every aten op that reaches it into the tracker's graph.

Owns: `ProxyDispatchMode` (a `TorchDispatchMode` installed in torch's PROXY infra-mode slot, so
torch's own machinery — SymNode arithmetic, FakeTensorMode — recognises it as the active proxy
tracer and routes symbolic arithmetic to `__sym_dispatch__`), the per-op policy (decomposition
table, CompositeImplicitAutograd decompositions, data-dependent ops, small-constant
propagation), and `PreDispatchFunctionMode` (grad-mode changes recorded under pre_dispatch).

Does not own: value -> node tracking (tracker.py) or setting up a trace (make_fx.py).

Call hierarchy of one op:
    __torch_dispatch__(func, types, args, kwargs)
      ├─ decomposition table hit ──► run the decomposition under this mode (re-enters here)
      ├─ CIA kernel and autograd would have used it ──► func.decompose(...) under this mode
      └─ _record: map args to nodes ─► real tensor args -> the trace's fakes (_fake_call_args)
                  ─► run func (fake/real kernel) ─► create node ─► track outputs
"""

from __future__ import annotations

import operator

import torch
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import (
    FakeTensor,
    UnsupportedOperatorException,
    fake_tensor_tls,
    should_allow_numbers_as_tensors,
    unset_fake_temporarily,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _push_mode, _unset_infra_mode

from ferrodyn.proxy_dispatch.tracker import SYM_TYPES, LazyNode, ProxyTracker

_aten = torch.ops.aten
_PROXY_KEY = torch._C._TorchDispatchModeKey.PROXY
_DEVICE_OP = torch.ops.prim.device.default
_IS_NONZERO = _aten.is_nonzero.default
_LIFT_FRESH = _aten.lift_fresh.default
_LIFT_FRESH_COPY = _aten.lift_fresh_copy.default
_LIFT_FNS = (_LIFT_FRESH, _LIFT_FRESH_COPY)
_FAKE_KEY = torch._C._TorchDispatchModeKey.FAKE
_get_dispatch_mode = torch._C._get_dispatch_mode
_mode_stack_len = torch._C._len_torch_dispatch_stack
_META = torch.device("meta")
_METADATA_OPS = (_aten.size.default, _aten.stride.default, _aten.storage_offset.default)
_HANDLED_TYPES = (torch.Tensor, torch.nn.Parameter, FakeTensor)
_CIA = DispatchKey.CompositeImplicitAutograd
_METADATA_MUTATORS = frozenset({"resize_", "resize_as_", "set_", "_resize_output_", "as_strided_"})
CONSTANT_NUMEL_LIMIT = 1  # tensors this small keep their value for .item() (as torch does)


class _OpInfo:
    """What the mode needs to know about one OpOverload, computed once per process (`op_info`):
    all of it comes from the op's schema, tags and kernel registrations."""

    __slots__ = (
        "name", "data_dependent", "seeded", "has_cia", "backend", "mutates_metadata", "factory",
        "fake_args",
    )

    def __init__(self, func):
        tags = func.tags
        self.name = _NAMER._target_to_str(func.overloadpacket.__name__)
        self.data_dependent = torch.Tag.data_dependent_output in tags
        self.seeded = torch.Tag.nondeterministic_seeded in tags
        self.has_cia = _CIA in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), _CIA
        )
        self.backend: dict[str, bool] = {}  # device type -> has a backend kernel
        # may change an argument's sizes/strides in place (view-in-place ops, resize/set_,
        # and out= ops, which resize their output)
        schema = func._schema
        # takes TensorOptions (empty_like, randn_like, ...): called through torch's variable
        # factories, which re-wrap a result that is referenced elsewhere
        self.factory = any(a.name in ("pin_memory", "layout") for a in schema.arguments)
        self.mutates_metadata = (
            torch.Tag.inplace_view in tags
            or func.overloadpacket.__name__ in _METADATA_MUTATORS
            or any(
                a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
                for a in schema.arguments
            )
        )
        # 0: never hand this op the trace's fakes of real tensor arguments (lift ops and
        # inplace_view ops, which the fake mode treats specially); 1: always; 2: only when some
        # tensor argument is fake already (with none, the fake mode runs an op that accepts
        # numbers as tensors for real and keeps the result as a constant)
        if func in _LIFT_FNS or torch.Tag.inplace_view in tags:
            self.fake_args = 0
        elif should_allow_numbers_as_tensors(func):
            self.fake_args = 2
        else:
            self.fake_args = 1

    def autograd_would_decompose(self, func, args, kwargs) -> bool:
        """True when eager autograd would have run the CIA decomposition (no backend kernel for
        the device of the first tensor argument), the test torch's tracer makes."""
        if not self.has_cia:
            return False
        t = _first_tensor(args)
        if t is None:
            t = _first_tensor(tuple(kwargs.values()))
        dev = t.device.type if t is not None else None
        has = self.backend.get(dev)
        if has is None:
            if dev is None:
                has = False
            else:
                key = torch._C._parse_dispatch_key(torch._C._dispatch_key_for_device(dev))
                has = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)
            self.backend[dev] = has
        return not has


_NAMER = torch.fx.Graph()  # only its node-name rule is used
_OP_INFO: dict = {}


def op_info(func) -> _OpInfo:
    info = _OP_INFO.get(func)
    if info is None:
        info = _OP_INFO[func] = _OpInfo(func)
    return info


def _first_tensor(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if type(a) in (list, tuple):
            for b in a:
                if isinstance(b, torch.Tensor):
                    return b
    return None


class ProxyDispatchMode(TorchDispatchMode):
    """Records aten ops into `tracker.graph`. One instance per trace."""

    def __init__(
        self,
        tracker: ProxyTracker,
        *,
        decomposition_table=None,
        pre_dispatch: bool = False,
        error_on_data_dependent_ops: bool = True,
    ):
        TorchDispatchMode.__init__(self, DispatchKey.PreDispatch if pre_dispatch else None)
        self.tracker = tracker
        self.decomposition_table = decomposition_table or {}
        self.pre_dispatch = pre_dispatch
        self.error_on_data_dependent_ops = error_on_data_dependent_ops
        self._mode_key = _PROXY_KEY
        self._enter_stack: list = []
        # read by torch code that inspects the active proxy mode
        self.decomp_layers = 0
        self.emulate_precision_casts = False

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True

    def __enter__(self):
        # only one proxy mode can be active: park the previous one while this one runs
        self._enter_stack.append(_unset_infra_mode(_PROXY_KEY))
        return TorchDispatchMode.__enter__(self)

    def __exit__(self, exc_type, exc_value, tb):
        try:
            return TorchDispatchMode.__exit__(self, exc_type, exc_value, tb)
        finally:
            prev = self._enter_stack.pop()
            if prev is not None:
                _push_mode(prev)

    # -- aten ops ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE_OP:
            # asked by C++ code of a FakeTensor (a Python-custom device): when only the fake
            # mode is left below, its own answer, without the trip through the dispatcher
            if (
                len(args) == 1 and not kwargs and type(args[0]) is FakeTensor
                and _mode_stack_len() <= 1
                and (_mode_stack_len() == 0 or _get_dispatch_mode(_FAKE_KEY) is not None)
            ):
                t = args[0]
                return _META if t.fake_mode.in_kernel_invocation else t.fake_device
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        for t in types:
            if t not in _HANDLED_TYPES and not self._all_tracked(args, kwargs):
                return NotImplemented

        decomp = self.decomposition_table.get(func)
        if decomp is not None:
            with self:
                self.decomp_layers += 1
                try:
                    return decomp(*args, **kwargs)
                finally:
                    self.decomp_layers -= 1

        info = _OP_INFO.get(func)
        if info is None:
            info = op_info(func)
        if (
            not self.pre_dispatch
            and func not in _METADATA_OPS
            and info.autograd_would_decompose(func, args, kwargs)
        ):
            with self:
                r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r

        if func is _IS_NONZERO:
            with self:
                torch._check(
                    args[0].numel() == 1,
                    lambda: "Boolean value of Tensor with more than one value is ambiguous",
                )
                return (args[0] != 0).item()
        return self._record(func, info, args, kwargs)

    def _all_tracked(self, args, kwargs) -> bool:
        tensors = self.tracker.tensors
        for a in (*args, *kwargs.values()):
            for t in (a if type(a) in (list, tuple) else (a,)):
                if isinstance(t, torch.Tensor) and type(t) not in _HANDLED_TYPES and t not in tensors:
                    return False
        return True

    def _record(self, func, info: _OpInfo, args, kwargs):
        tracker = self.tracker
        node_args, node_kwargs = tracker.op_args(args, kwargs)

        constants = tracker.constants
        all_constant = any_constant = False
        if constants:
            all_constant, any_constant = self._constant_flags(args, kwargs)

        if info.data_dependent:
            if all_constant and any_constant:
                with unset_fake_temporarily():
                    return func(*self._constant_args(args), **self._constant_kwargs(kwargs))
            if self.error_on_data_dependent_ops and _all_real(args, kwargs):
                raise RuntimeError(
                    f"make_fx: {func} reads the value of a tensor being traced (data-dependent "
                    "control flow or .item()/.tolist()); the graph cannot capture that with "
                    "tracing_mode='real'. Try tracing_mode='symbolic'."
                )

        name = info.name
        if func is _LIFT_FRESH:
            func = _LIFT_FRESH_COPY  # recorded (and named) as the copy, as torch's tracer does
            name = op_info(func).name
        if info.mutates_metadata:
            tracker.before_metadata_mutation(args, kwargs)
        call_args, call_kwargs = args, kwargs
        if info.fake_args and tracker.fake_mode is not None and not self.pre_dispatch:
            call_args, call_kwargs = self._fake_call_args(info, args, kwargs)
        tracker.lazy = True
        try:
            out = func(*call_args, **call_kwargs)
        except UnsupportedOperatorException as e:
            raise RuntimeError(
                f"make_fx: operator {func} has no fake (meta) implementation, so it cannot be "
                "traced with tracing_mode='fake' or 'symbolic'; register one "
                "(torch.library.register_fake) or trace with tracing_mode='real'"
            ) from e
        finally:
            tracker.lazy = False

        # A factory's result must not be referenced from the graph when it goes back to C++:
        # torch's variable factories re-wrap a result that has other references by detaching
        # it (through this very mode). So those values are snapshotted instead.
        keep_raw = not info.factory and (
            _first_tensor(args) is not None
            or (bool(kwargs) and _first_tensor(tuple(kwargs.values())) is not None)
        )
        node = tracker.call(func, node_args, node_kwargs, name, out, keep_raw)

        constant = None
        if func is _LIFT_FRESH_COPY and out.numel() <= CONSTANT_NUMEL_LIMIT:
            with unset_fake_temporarily():
                constant = args[0].clone()
        elif all_constant and any_constant and not info.seeded and _all_small(out):
            with unset_fake_temporarily():
                constant = func(*self._constant_args(args), **self._constant_kwargs(kwargs))

        fake_mode = tracker.fake_mode
        if fake_mode is not None and fake_mode.shape_env is not None:
            if fake_mode.shape_env.pending_fresh_unbacked_symbols:
                from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings

                bindings = compute_unbacked_bindings(fake_mode.shape_env, out)
                if bindings:
                    node.meta["unbacked_bindings"] = bindings
        tracker.lazy = True
        try:
            tracker.track_output(out, node, constant)
        finally:
            tracker.lazy = False
        return out

    def _fake_call_args(self, info: _OpInfo, args, kwargs):
        """`args`, `kwargs` with each real tensor (a parameter, buffer or constant closed over
        by the traced function) replaced by the trace's one fake of it (`tracker.fake_of`):
        the fake mode would convert it itself, once per op, and would not cache the op's
        result (its dispatch cache refuses real arguments). Done only where the fake mode's
        own conversion applies: it is the active fake mode and accepts real inputs (and not
        under pre_dispatch, where autograd runs below this mode and sees the arguments)."""
        fake_mode = self.tracker.fake_mode
        if _get_dispatch_mode(_FAKE_KEY) is not fake_mode:
            return args, kwargs
        allow = fake_tensor_tls.allow_non_fake_inputs_override
        if not (fake_mode.allow_non_fake_inputs if allow is None else allow):
            return args, kwargs
        real = any_fake = False
        for a in (*args, *kwargs.values()):
            for t in (a if type(a) in (list, tuple) else (a,)):
                tt = type(t)
                if tt is torch.Tensor or tt is torch.nn.Parameter:
                    real = True
                elif tt is FakeTensor:
                    any_fake = True
        if not real or (info.fake_args == 2 and not any_fake):
            return args, kwargs
        fake_of = self.tracker.fake_of

        def sub(a):
            ta = type(a)
            if ta is torch.Tensor or ta is torch.nn.Parameter:
                return fake_of(a)
            if ta is list or ta is tuple:
                return ta(sub(x) for x in a)
            return a

        return tuple(sub(a) for a in args), {k: sub(v) for k, v in kwargs.items()}

    # -- small constants (torch.tensor(...) literals) ---------------------------------------
    def _constant_flags(self, args, kwargs):
        constants = self.tracker.constants
        all_c, any_c = True, False
        for a in (*args, *kwargs.values()):
            for t in (a if type(a) in (list, tuple) else (a,)):
                if isinstance(t, torch.Tensor):
                    if t in constants:
                        any_c = True
                    else:
                        all_c = False
                elif isinstance(t, SYM_TYPES):
                    all_c = False
        return all_c, any_c

    def _constant_args(self, args):
        constants = self.tracker.constants

        def c(a):
            if type(a) in (list, tuple):
                return type(a)(c(x) for x in a)
            return constants[a] if isinstance(a, torch.Tensor) else a

        return tuple(c(a) for a in args)

    def _constant_kwargs(self, kwargs):
        return dict(zip(kwargs, self._constant_args(tuple(kwargs.values()))))

    # -- symbolic arithmetic ----------------------------------------------------------------
    def __sym_dispatch__(self, func, types, args, kwargs):
        """Called by torch's SymNode magic methods while this mode is the proxy mode: run the
        arithmetic and record it (`s0 * 2` becomes an `operator.mul` node)."""
        if func is operator.mul:  # peephole: multiply by one is the identity
            if isinstance(args[1], int) and args[1] == 1:
                return args[0]
            if isinstance(args[0], int) and args[0] == 1:
                return args[1]
        out = func(*args, **kwargs)
        if isinstance(out, SYM_TYPES):
            tracker = self.tracker

            def make():
                if len(args) == 1 and type(args[0]) in (list, tuple):  # torch.sym_sum([...])
                    n_args = (tuple(_sym_arg(tracker, a) for a in args[0]),)
                else:
                    n_args = tuple(_sym_arg(tracker, a) for a in args)
                node = tracker.graph.create_node("call_function", func, n_args, {})
                node.meta["val"] = out
                return node

            tracker.set_sym(out, LazyNode(make) if tracker.lazy else make())
        return out


def _sym_arg(tracker, a):
    """An argument of recorded SymInt arithmetic: the node that produced a tracked value even
    when its expression is a number (`0 * n` stays a node, as torch's _compute_proxy)."""
    if not isinstance(a, SYM_TYPES):
        return a
    return tracker.produced_node(a)


def _all_real(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        for t in (a if type(a) in (list, tuple) else (a,)):
            if isinstance(t, FakeTensor):
                return False
    return True


def _all_small(out) -> bool:
    if isinstance(out, torch.Tensor):
        return out.numel() <= CONSTANT_NUMEL_LIMIT
    if type(out) in (list, tuple):
        return all(_all_small(o) for o in out)
    return True


def _pre_dispatch_mode_class():
    """torch's pre-dispatch mode stack accepts only its own mode classes, so under pre_dispatch
    the mode also derives from torch's ProxyTorchDispatchMode (for that isinstance check only:
    every method used is this module's)."""
    global _PreDispatchProxyMode
    if _PreDispatchProxyMode is None:
        from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode

        class PreDispatchProxyMode(ProxyDispatchMode, ProxyTorchDispatchMode):
            __torch_dispatch__ = ProxyDispatchMode.__torch_dispatch__
            __sym_dispatch__ = ProxyDispatchMode.__sym_dispatch__
            __enter__ = ProxyDispatchMode.__enter__
            __exit__ = ProxyDispatchMode.__exit__

        _PreDispatchProxyMode = PreDispatchProxyMode
    return _PreDispatchProxyMode


_PreDispatchProxyMode = None


def make_mode(tracker: ProxyTracker, *, decomposition_table=None, pre_dispatch: bool = False):
    cls = _pre_dispatch_mode_class() if pre_dispatch else ProxyDispatchMode
    return cls(tracker, decomposition_table=decomposition_table, pre_dispatch=pre_dispatch)


class PreDispatchFunctionMode(TorchFunctionMode):
    """Under pre_dispatch, grad-mode switches are program state the graph must replay: record
    `torch._C._set_grad_enabled(flag)` as a node (and still apply it)."""

    def __init__(self, tracker: ProxyTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch._C._set_grad_enabled:
            node = self.tracker.graph.create_node("call_function", func, tuple(args), {})
            node.meta["val"] = None
        return func(*args, **kwargs)

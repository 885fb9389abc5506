"""Value -> graph-node tracking for one make_fx trace.

Owns: the `ProxyTracker`, which holds the `torch.fx.Graph` under construction and maps every
live traced value to the fx node that produces it:

- tensors -> node, in a `ferrodyn.weak.WeakTensorKeyDictionary` (an entry dies with its tensor;
  an in-place op re-points the tensor at the node of the op);
- SymInt/SymFloat/SymBool -> node, keyed by the value's `SymNode` in a
  `ferrodyn.weak.WeakIdKeyDictionary` (first producer wins, so a size read off an input stays
  tied to that input); size/stride/numel accessors are recorded lazily (`LazyNode`) and only
  enter the graph when some op uses them;
- untracked tensors (closed-over constants, parameters) -> `get_attr` nodes on the root module;
  under a fake mode each is fakified once per trace (`fake_of`, held until the trace ends).

Also owns the example values stored in `node.meta["val"]` (as torch's make_fx records them:
detached, non-view FakeTensors describing the value when it was produced; no value for a plain
number result) and `node.meta["tensor_meta"]` (`set_tensor_meta`; the memory formats of symbolic
tensors are memoised per trace in `format_memo`, only for checks that left the ShapeEnv as it
was). Does not own dispatch (mode.py) nor the entry point (make_fx.py).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import SymBool, SymFloat, SymInt, Tensor
from torch._subclasses.fake_impls import fast_detach
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.sym_node import SymNode as _SymNode
from torch.fx.passes.shape_prop import TensorMetadata, _extract_tensor_metadata

from ferrodyn.weak import WeakIdKeyDictionary, WeakTensorKeyDictionary

SYM_TYPES = (SymInt, SymFloat, SymBool)
_PLAIN_SCALARS = frozenset({bool, int, float, complex})

_aten = torch.ops.aten
_SYM_SIZE = _aten.sym_size.int
_SYM_STRIDE = _aten.sym_stride.int
_SYM_NUMEL = _aten.sym_numel.default
_SYM_STORAGE_OFFSET = _aten.sym_storage_offset.default


def set_tensor_meta(node: fx.Node, t: Tensor, memo: dict | None = None) -> None:
    """`node.meta["tensor_meta"]` for tensor value `t`, as torch's tracer records it right after
    tracking each tensor it produces (a placeholder, an op's output): computed from the live
    value (its memory-format checks may add guards to the ShapeEnv, as in torch); none for a
    real sparse tensor. A dense tensor with static sizes and strides takes its memory format
    from `_MEMORY_FORMATS` (torch's checks are a pure function of those ints); one with
    symbolic sizes or strides from `memo` (the trace's, see `_symbolic_format_key`) when the
    same checks ran before in the same ShapeEnv state and changed nothing."""
    if type(t) is not FakeTensor and t.is_sparse:
        return
    if t.layout is torch.strided and not t.is_quantized:
        shape, stride = t.shape, t.stride()
        if all(type(v) is int for v in shape) and all(type(v) is int for v in stride):
            key = (tuple(shape), stride)
            fmt = _MEMORY_FORMATS.get(key, _UNKNOWN)
            if fmt is _UNKNOWN:
                fmt = _extract_tensor_metadata(t).memory_format
                if len(_MEMORY_FORMATS) >= 4096:
                    _MEMORY_FORMATS.clear()
                _MEMORY_FORMATS[key] = fmt
            node.meta["tensor_meta"] = TensorMetadata(
                shape, t.dtype, t.requires_grad, stride, fmt, False, {}
            )
            return
        if memo is not None and type(t) is FakeTensor:
            env = t.fake_mode.shape_env
            key = _symbolic_format_key(env, shape, stride, t.numel())
            if key is not None:
                fmt = memo.get(key, _UNKNOWN)
                if fmt is not _UNKNOWN:
                    node.meta["tensor_meta"] = TensorMetadata(
                        shape, t.dtype, t.requires_grad, stride, fmt, False, {}
                    )
                    return
                meta = _extract_tensor_metadata(t)
                if _shape_env_state(env) == key[0]:  # the checks guarded nothing
                    memo[key] = meta.memory_format
                node.meta["tensor_meta"] = meta
                return
    node.meta["tensor_meta"] = _extract_tensor_metadata(t)


def _shape_env_state(env) -> tuple:
    """What torch's symbolic evaluation reads from a ShapeEnv that can change during a trace,
    summarised: a new guard, replacement, divisibility fact, runtime assert or symbol (with its
    range) changes one of these counts; `_version_counter` is torch's own summary."""
    return (
        len(env.guards), len(env.replacements), env._replacements_version_counter,
        len(env.divisible), env.num_deferred_runtime_asserts, len(env.var_to_range),
        len(env.axioms), env._version_counter,
    )


def _symbolic_format_key(env, shape, stride, numel):
    """The memo key of torch's memory-format checks on a dense FakeTensor with symbolic sizes or
    strides: the ShapeEnv state, and each size, stride and the numel as an int or as the
    (unreplaced expression, hint) of its SymNode. The checks read nothing else: they evaluate
    relations of those expressions statically (a function of the expressions and the ShapeEnv
    state) or, where that fails, from the hints (with a guard, which changes the state, so such
    a result is never memoised; or, with guards suppressed, from the hints alone). None when a
    value is not a plain SymInt of `env`."""
    if env is None:
        return None
    parts = []
    for v in (*shape, *stride, numel):
        if type(v) is int:
            parts.append(v)
        elif type(v) is SymInt:
            n = v.node
            if type(n) is not _SymNode or n.shape_env is not env or n.constant is not None:
                return None
            parts.append((n._expr, n._hint))
        else:
            return None
    return (_shape_env_state(env), len(shape), tuple(parts))


_MEMORY_FORMATS: dict = {}  # (sizes, strides) -> memory format, for dense static tensors
_UNKNOWN = object()


class LazyNode:
    """A node that is created on first use (`force`): the size/stride/numel accessor of a traced
    tensor, or symbolic arithmetic done while an op runs. Unused ones never reach the graph."""

    __slots__ = ("_make", "_node")

    def __init__(self, make):
        self._make = make
        self._node = None

    def force(self) -> fx.Node:
        if self._node is None:
            self._node = self._make()
            self._make = None
        return self._node


def _force(entry):
    return entry.force() if type(entry) is LazyNode else entry


class ProxyTracker:
    """The graph being built and the tracking dictionaries of one trace.

    `lazy` is True while an op's kernel runs or its outputs are tracked: symbolic values created
    then get a `LazyNode` instead of an immediate node.
    """

    def __init__(self, *, fake_mode=None, symbolic: bool = False):
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.tensors = WeakTensorKeyDictionary()
        self.syms = WeakIdKeyDictionary()
        # sympy.Symbol -> node entry: the fallback for a SymInt whose SymNode was never seen
        # (recomputed outside the trace) but whose expression is a plain symbol we know.
        self.symbols: dict = {}
        self.constants = WeakTensorKeyDictionary()  # tensor -> its small constant value
        self.fake_mode = fake_mode
        self.track_syms = fake_mode is not None and fake_mode.shape_env is not None
        self.symbolic = symbolic
        self.lazy = False
        self._const_names: dict[int, tuple[str, object]] = {}
        # prefix -> the lowest N that may be free for `{prefix}{N}` on the root (names are taken
        # in order and never freed during a trace, so the search starts there, not at 0)
        self._next_attr: dict[str, int] = {}
        self._val_mode = None
        # id(FakeTensor) -> the node whose meta["val"] is that very tensor (ids are stable:
        # the node keeps the tensor alive for the whole trace)
        self._raw_vals: dict[int, fx.Node] = {}
        # id(real tensor) -> (that tensor, its fake): each real tensor the trace meets under a
        # fake mode is converted once, and the fake is kept (the converter's own memo holds
        # fakes weakly, so without this each op converted it again)
        self._fakes: dict[int, tuple[Tensor, FakeTensor]] = {}
        # memory formats of symbolic tensors, see set_tensor_meta (None: not symbolic)
        self.format_memo: dict | None = {} if self.track_syms else None

    # -- example values ---------------------------------------------------------------------
    def example_value(self, val):
        """What `node.meta["val"]` holds for `val` (a snapshot, see `_keep_val`): real tensors
        become a FakeTensor with the same metadata; symbolic and plain scalars are kept."""
        if isinstance(val, Tensor):
            if isinstance(val, FakeTensor):
                return fast_detach(val.fake_mode, val)
            if val.is_sparse:
                return None
            fake_mode = self.fake_mode
            if fake_mode is not None:
                # a real constant under fake tracing: the fake mode's own conversion (memoised,
                # so the op using the constant reuses it), snapshotted
                return fast_detach(fake_mode, self.fake_of(val))
            return self._fake_like(val)
        if isinstance(val, (list, tuple)):
            return type(val)(self.example_value(v) for v in val)
        return val

    def fake_of(self, t: Tensor) -> FakeTensor:
        """The trace's fake of real tensor `t`: the fake mode's own conversion (what it does to
        a real argument of an op), made once per trace."""
        entry = self._fakes.get(id(t))
        if entry is not None and entry[0] is t:
            return entry[1]
        fake_mode = self.fake_mode
        fake = fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, t)
        self._fakes[id(t)] = (t, fake)
        return fake

    def _keep_val(self, node: fx.Node, val) -> None:
        """Store `val` as `node.meta["val"]`. A fresh FakeTensor result is stored as it is
        (copy-on-write: `before_metadata_mutation` snapshots it if an op later changes its
        sizes or strides in place); one that is already some node's value (an in-place or out=
        result) or carries autograd state is snapshotted (a detached alias) right away."""
        if type(val) is FakeTensor:
            if id(val) in self._raw_vals or val.requires_grad:
                val = fast_detach(val.fake_mode, val)
            else:
                self._raw_vals[id(val)] = node
            node.meta["val"] = val
        else:
            node.meta["val"] = self.example_value(val)

    def before_metadata_mutation(self, args, kwargs) -> None:
        """An op is about to change a tensor's metadata in place (t_, unsqueeze_, resize_,
        out=...): give the nodes holding those tensors as values their own snapshot first."""
        raw = self._raw_vals
        for a in (*args, *kwargs.values()):
            for t in (a if type(a) in (list, tuple) else (a,)):
                node = raw.pop(id(t), None) if isinstance(t, Tensor) else None
                if node is not None and node.meta.get("val") is t:
                    node.meta["val"] = fast_detach(t.fake_mode, t)

    def finish_vals(self) -> None:
        """The trace is over: each value kept as it was produced (`_keep_val`) that autograd
        has since marked (requires_grad, a grad_fn) or made a view of its base is replaced by
        a snapshot, so every `meta["val"]` is a plain detached FakeTensor, as torch records."""
        for node in self._raw_vals.values():
            val = node.meta.get("val")
            if type(val) is FakeTensor and (val.requires_grad or val._is_view()):
                node.meta["val"] = fast_detach(val.fake_mode, val)
        self._raw_vals.clear()

    def _fake_like(self, t: Tensor):
        mode = self._val_mode
        if mode is None:
            mode = self._val_mode = _shared_val_mode()
        with torch._C._DisableTorchDispatch():  # never seen by an enclosing trace's modes
            meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        return FakeTensor(mode, meta, t.device)

    # -- nodes ------------------------------------------------------------------------------
    def call(self, target, args, kwargs, name, val, keep_raw: bool = True):
        node = self.graph.create_node("call_function", target, args, kwargs, name)
        if type(val) in _PLAIN_SCALARS:
            return node  # torch's tracer records no value for a plain number result
        if keep_raw:
            self._keep_val(node, val)
        else:
            node.meta["val"] = self.example_value(val)
        return node

    def placeholder(self, name: str, val):
        node = self.graph.create_node("placeholder", name, (), {}, name)
        node.target = node.name  # the signature uses the target: keep it unique too
        self._keep_val(node, val)
        return node

    def constant_node(self, t: Tensor) -> fx.Node:
        """A `get_attr` node for a tensor the trace did not produce: parameters become
        `_param_constantN`, other tensors `_tensor_constantN`, each stored once on the root."""
        prefix = "_param_constant" if isinstance(t, torch.nn.Parameter) else "_tensor_constant"
        node = self._attr_node(t, prefix)
        node.meta["val"] = self.example_value(t)
        return node

    def object_node(self, obj) -> fx.Node:
        """A `get_attr` node (`_output_constantN`) for a result leaf that is neither traced nor
        a literal fx can write as source (a slice, a complex, an enum, any object): the graph
        returns that very object."""
        return self._attr_node(obj, "_output_constant")

    def _attr_node(self, obj, prefix: str) -> fx.Node:
        entry = self._const_names.get(id(obj))
        if entry is None or entry[1] is not obj:
            i = self._next_attr.get(prefix, 0)
            while hasattr(self.root, f"{prefix}{i}"):
                i += 1
            self._next_attr[prefix] = i + 1
            qualname = f"{prefix}{i}"
            setattr(self.root, qualname, obj)
            self._const_names[id(obj)] = entry = (qualname, obj)
        return self.graph.create_node("get_attr", entry[0], (), {}, entry[0])

    # -- lookups ----------------------------------------------------------------------------
    def tensor_node(self, t: Tensor) -> fx.Node:
        node = self.tensors.get(t)
        if node is None:
            return self.constant_node(t)
        return node

    def sym_node(self, s) -> object:
        """The graph argument standing for SymInt/SymFloat/SymBool `s`: a plain constant when
        `s` is known, else the node that produced it."""
        n = s.node
        if n.constant is not None:
            return n.constant
        expr = n.expr
        if expr.is_number:
            if isinstance(s, SymBool):
                return bool(expr)
            return int(expr) if isinstance(s, SymInt) else float(expr)
        entry = self.syms.get(n)
        if entry is None:
            entry = self.symbols.get(expr)
            if entry is None:
                raise RuntimeError(
                    f"make_fx: the symbolic value {expr} ({type(s).__name__}) was not produced "
                    "by any traced operation, so the graph cannot compute it. It was probably "
                    "computed outside the trace (e.g. with tracing disabled) and used inside it."
                )
        return _force(entry)

    def produced_node(self, s) -> object:
        """The node that produced SymInt/SymFloat/SymBool `s` when one did (even for a known
        value), else `sym_node(s)`."""
        entry = self.syms.get(s.node)
        return _force(entry) if entry is not None else self.sym_node(s)

    def op_args(self, args, kwargs) -> tuple[tuple, dict]:
        """The graph form of an op's (args, kwargs), creating nodes in torch's order: first the
        nodes of the symbolic values (lazy accessors forced, left to right), then the `get_attr`
        nodes of untracked tensors (torch's tracer makes those when it builds the call node)."""
        if self.track_syms:
            for a in (*args, *kwargs.values()):
                self._force_syms(a)
        node_args = self.arg(args)
        return node_args, ({k: self.arg(v) for k, v in kwargs.items()} if kwargs else {})

    def _force_syms(self, a) -> None:
        t = type(a)
        if t is tuple or t is list or t is torch.Size:
            for x in a:
                self._force_syms(x)
        elif t in SYM_TYPES:
            self.sym_node(a)

    def arg(self, a):
        """Map one op argument (a leaf, or a list/tuple of leaves) to its graph form."""
        t = type(a)
        if t is tuple or t is list:
            return t([self.arg(x) for x in a])
        if t is torch.Size:  # a decomposition may pass sizes on as they came
            return [self.arg(x) for x in a]
        if isinstance(a, Tensor):
            node = self.tensors.get(a)
            return self.constant_node(a) if node is None else node
        if isinstance(a, SYM_TYPES):
            return self.sym_node(a)
        return a

    # -- tracking ---------------------------------------------------------------------------
    def set_sym(self, s, entry) -> None:
        """Tie SymInt/SymFloat/SymBool `s` to `entry` (a node or LazyNode) unless its SymNode
        is tracked already (first producer wins)."""
        n = s.node
        if n in self.syms:
            return
        self.syms[n] = entry
        expr = n._expr if hasattr(n, "_expr") else n.expr
        if expr.is_Symbol and expr not in self.symbols:
            self.symbols[expr] = entry

    def track_tensor(self, t: Tensor, node: fx.Node, constant=None) -> None:
        self.tensors[t] = node
        if constant is not None:
            self.constants[t] = constant
        elif self.constants and t in self.constants:
            del self.constants[t]
        if not self.track_syms:
            return
        for i, s in enumerate(t.shape):
            if type(s) is SymInt:
                self._lazy_accessor(s, _SYM_SIZE, (node, i))
        if not t.is_sparse:
            for i, s in enumerate(t.stride()):
                if type(s) is SymInt:
                    self._lazy_accessor(s, _SYM_STRIDE, (node, i))
        s = t.numel()
        if type(s) is SymInt:
            self._lazy_accessor(s, _SYM_NUMEL, (node,))
        if not t.is_sparse:
            s = t.storage_offset()
            if type(s) is SymInt:
                self._lazy_accessor(s, _SYM_STORAGE_OFFSET, (node,))

    def _lazy_accessor(self, s, target, args) -> None:
        if s.node in self.syms:
            return

        def make():
            node = self.graph.create_node("call_function", target, args, {})
            node.meta["val"] = s
            return node

        self.set_sym(s, LazyNode(make))

    def track_output(self, out, node: fx.Node, constant=None) -> None:
        """Track an op's result: a tensor, a SymInt, or a list/tuple of them (each element then
        gets its own `getitem` node, in order, like torch's tracer)."""
        if isinstance(out, Tensor):
            self.track_tensor(out, node, constant)
            set_tensor_meta(node, out, self.format_memo)
        elif isinstance(out, SYM_TYPES):
            self.set_sym(out, node)
        elif isinstance(out, (tuple, list)):
            graph = self.graph
            for i, e in enumerate(out):
                item = graph.create_node("call_function", operator.getitem, (node, i), {})
                self._keep_val(item, e)
                c = constant[i] if constant is not None else None
                self.track_output(e, item, c)

    def forget(self) -> None:
        """Drop every tracked value (the dictionaries are empty once a trace is over)."""
        self.tensors.clear()
        self.syms.clear()
        self.constants.clear()
        self.symbols.clear()
        self._raw_vals.clear()
        self._fakes.clear()
        if self.format_memo is not None:
            self.format_memo.clear()


_VAL_MODE = None


def _shared_val_mode():
    """One FakeTensorMode, shared by all traces, that owns the FakeTensors describing real
    values (creating a mode costs ~0.4 ms, so it is made once)."""
    global _VAL_MODE
    if _VAL_MODE is None:
        _VAL_MODE = FakeTensorMode(allow_fallback_kernels=True)
    return _VAL_MODE

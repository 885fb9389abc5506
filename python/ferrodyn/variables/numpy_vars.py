"""numpy inside compiled frames: ndarrays and numpy calls traced through `torch._numpy`.

Owns the numpy trackers and how each numpy construct becomes graph nodes:
- `NdarrayVariable`: an ndarray whose data is a graph tensor (made by `Tensor.numpy()`, a frame
  input read with `torch.as_tensor`, or a numpy call). Operations on it are fx nodes whose
  targets (`NumpyCall`, `NumpyMethod`, `NumpyOperator`) call the `torch._numpy` equivalent on
  the tensor and hand tensors back; at the graph's outputs `ndarray_output` turns the tensor
  into a real `np.ndarray` (or numpy scalar) again.
- `NumpyFunctionVariable` (numpy functions, ufuncs, scalar types; pure ones with constant
  arguments fold, `np.random` breaks the graph: its global RNG state is not modelled),
  `NumpyConstVariable` (numpy scalars, dtypes, finfo/iinfo known at trace time).
- The eager oracle: every traced numpy operation is also run by real numpy on arrays of the
  same dtype, shape and strides (zeros); its result decides what the compiled code returns
  (numpy scalar or 0-d array, dtype, strides, read-only flag, which input it is or views) and a
  `torch._numpy` result that differs in dtype, shape, container or aliasing refuses
  (`unsupported`): values come from the graph, everything else is numpy's own answer.
Does not own Tensor methods (tensor.py hands `Tensor.numpy` here), the builder's type table
(builder.py calls `build_numpy`) or the generated entry code (codegen.py renders
`NumpyTensorSource`).
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch._numpy as tnp

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import AttrSource, Source
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable, is_constant_value
from ferrodyn.variables.numpy_graph import (NP_TO_TORCH, TORCH_TO_NP, NumpyCall, NumpyMethod,
                                            NumpyOperator, NumpyTensorSource, NumpyTarget,
                                            ndarray_as_tensor, ndarray_output)

# ---- the eager oracle -------------------------------------------------------------------------

def _np_dtype(tdtype: torch.dtype, what: str) -> np.dtype:
    d = TORCH_TO_NP.get(tdtype)
    if d is None:
        unsupported(f"{what}: dtype {tdtype} has no numpy equivalent", BreakReason.EXCEPTION)
    return d


def _concrete_shape(fake: torch.Tensor, what: str) -> tuple[int, ...]:
    shape = tuple(fake.shape)
    if not all(type(s) is int for s in shape):
        unsupported(f"{what}: an ndarray of symbolic shape (numpy's answers need sizes)",
                    BreakReason.UNSUPPORTED_TYPE)
    return shape


def _zeros(shape, dtype: np.dtype, strides) -> np.ndarray:
    """A zero-filled array of this shape, dtype and byte strides (the oracle's stand-in)."""
    if any(s < 0 for s in strides):
        unsupported("an ndarray with negative strides", BreakReason.UNSUPPORTED_TYPE)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) // dtype.itemsize \
        if all(shape) else 1
    buf = np.zeros(max(span, 1), dtype)
    return np.lib.stride_tricks.as_strided(buf, shape, strides, writeable=True)


def _run_eager(fn: Callable[[], Any], what: str) -> Any:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return fn()
        except Exception as e:
            unsupported(f"{what} raised {type(e).__name__} in numpy: {e}", BreakReason.EXCEPTION)


# ---- trackers -----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class NdarrayVariable(VariableTracker):
    """An ndarray (or numpy scalar, `np_type` not ndarray) whose data is graph tensor `node`.
    `np_strides`: numpy's byte strides when they differ from the tensor's; `writeable`: numpy's
    flag (a read-only array refuses writes)."""

    node: torch.fx.Node = None  # type: ignore[assignment]
    example: Any = None
    np_type: type = np.ndarray
    np_strides: tuple | None = None
    writeable: bool = True

    @property
    def scalar(self) -> bool:
        return self.np_type is not np.ndarray

    def python_type(self) -> type:
        return self.np_type

    def identity(self) -> Any:
        return self.node

    def describe(self) -> str:
        return f"{'numpy scalar' if self.scalar else 'ndarray'} {self.node.name}"

    def strides(self) -> tuple:
        if self.np_strides is not None:
            return self.np_strides
        item = _np_dtype(self.example.dtype, self.describe()).itemsize
        return tuple(int(s) * item for s in self.example.stride())

    def oracle_value(self) -> Any:
        """Zeros standing for this value in the eager oracle (fresh each time)."""
        what = self.describe()
        dtype = _np_dtype(self.example.dtype, what)
        if self.scalar:
            return self.np_type(0)
        z = _zeros(_concrete_shape(self.example, what), dtype, self.strides())
        if not self.writeable:
            z.flags.writeable = False
        return z

    def var_getattr(self, tx, name):
        if name == "__class__":
            return NumpyFunctionVariable(value=self.np_type)
        if name in _REFUSED_ATTRS:
            unsupported(f"ndarray attribute .{name}", _REFUSED_ATTRS[name])
        probe = _run_eager(lambda: getattr(self.oracle_value(), name), f"ndarray.{name}")
        if callable(probe) and not isinstance(probe, (np.ndarray, np.generic)):
            return NdarrayMethodVariable(arr=self, name=name)
        if name in _GRAPH_ATTRS:
            return numpy_op(tx, NumpyMethod(name, attr=True), [self], {},
                            lambda a: getattr(a, name), f"ndarray.{name}")
        return wrap_numpy_constant(probe, f"ndarray.{name}")

    def has_attr(self, tx, name):
        return hasattr(self.oracle_value(), name)

    def call_method(self, tx, name, args, kwargs):
        return NdarrayMethodVariable(arr=self, name=name).call_function(tx, args, kwargs)

    def truth(self, tx):
        unsupported(f"truth value of {self.describe()}", BreakReason.DATA_DEPENDENT)

    def length(self, tx):
        shape = _concrete_shape(self.example, self.describe())
        if self.scalar or not shape:
            unsupported(f"len() of {self.describe()}", BreakReason.EXCEPTION)
        return shape[0]

    def unpack(self, tx):
        return [self.getitem(tx, ConstantVariable(value=i)) for i in range(self.length(tx))]

    def getitem(self, tx, index):
        return numpy_op(tx, NumpyOperator(operator.getitem), [self, index], {},
                        operator.getitem, "ndarray indexing")

    def setitem(self, tx, index, value):
        numpy_op(tx, NumpyOperator(operator.setitem, inplace=True), [self, index, value], {},
                 operator.setitem, "ndarray item assignment")

    def contains(self, tx, item):
        unsupported("`in` on an ndarray", BreakReason.DATA_DEPENDENT)

    def setattr(self, tx, name, value):
        unsupported(f"setting ndarray attribute .{name}", BreakReason.SIDE_EFFECT)

    def fx_arg(self, tx):
        unsupported(f"{self.describe()} as an argument of a torch op (torch would convert it "
                    f"to a tensor)", BreakReason.UNSUPPORTED_TYPE)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutCall, OutConst, OutSource
        if self.source is not None and self.node.op == "placeholder":
            return OutSource(self.source)  # the frame's own ndarray object
        strides = self.np_strides if not self.scalar else None
        shape = self.example.shape
        graph_strides = tuple(int(st) * self.example.element_size() for st in self.example.stride())
        if strides is not None and \
                any(x != y and n > 1 for x, y, n in zip(strides, graph_strides, shape)):
            z = self.oracle_value()  # numpy's is a new array (else the views would agree)
            dense = sorted((abs(st), n) for st, n in zip(strides, z.shape) if n > 1)
            expect = z.dtype.itemsize
            for st, n in dense:  # the layout a fresh copy can take: dense, no overlap
                if st != expect:
                    unsupported(f"returning {self.describe()}: numpy's memory layout "
                                f"{strides} differs from the graph's", BreakReason.UNSUPPORTED_TYPE)
                expect *= n
        node = self.node
        return tx.output.side_effects.shared(node, lambda: OutCall(ndarray_output, (
            tx.graph_output(node), OutConst(self.scalar), OutConst(strides),
            OutConst(not self.writeable))))


@dataclass(frozen=True, eq=False)
class NdarrayMethodVariable(VariableTracker):
    """`a.name` for an ndarray method, before the call."""

    arr: NdarrayVariable = None  # type: ignore[assignment]
    name: str = ""

    def describe(self) -> str:
        return f"ndarray method .{self.name}"

    def call_function(self, tx, args, kwargs):
        name = self.name
        if name in _REFUSED_METHODS:
            unsupported(f"ndarray.{name}()", _REFUSED_METHODS[name])
        return numpy_op(tx, NumpyMethod(name), [self.arr, *args], kwargs,
                        lambda a, *r, **k: getattr(a, name)(*r, **k), f"ndarray.{name}()")


@dataclass(frozen=True, eq=False)
class _NumpyValueVariable(VariableTracker):
    """A numpy object known at trace time and rebuilt as that same object: what numpy
    constants and numpy callables share."""

    value: Any = None

    def python_type(self) -> type:
        return type(self.value)

    def as_python_constant(self) -> Any:
        return self.value

    def identity(self) -> Any:
        return ("obj", id(self.value))

    def has_attr(self, tx, name):
        return hasattr(self.value, name)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        return OutConst(self.value)


@dataclass(frozen=True, eq=False)
class NumpyConstVariable(_NumpyValueVariable):
    """A numpy value known at trace time: a numpy scalar, a dtype, a finfo/iinfo."""

    def describe(self) -> str:
        return f"numpy constant {self.value!r}"

    def var_getattr(self, tx, name):
        attr = _run_eager(lambda: getattr(self.value, name), f"attribute {name!r}")
        if callable(attr) and not isinstance(attr, type):
            return _FoldedMethodVariable(obj=self.value, name=name)
        return wrap_numpy_constant(attr, f"attribute {name!r}")

    def truth(self, tx):
        return bool(_run_eager(lambda: bool(self.value), "bool()"))

    def fx_arg(self, tx):
        unsupported(f"{self.describe()} as an argument of a torch op",
                    BreakReason.UNSUPPORTED_TYPE)


@dataclass(frozen=True, eq=False)
class _FoldedMethodVariable(VariableTracker):
    """A method of a numpy constant (`np.float32(1).item`): numpy scalars and dtypes are
    immutable, so their methods fold on constant arguments."""

    obj: Any = None
    name: str = ""

    def call_function(self, tx, args, kwargs):
        vals = _constant_args(args, kwargs, f"{type(self.obj).__name__}.{self.name}")
        fn = getattr(self.obj, self.name)
        return wrap_numpy_constant(_run_eager(lambda: fn(*vals[0], **vals[1]), self.name),
                                   self.name)


def _constant_args(args, kwargs, what):
    if not all(a.is_python_constant() for a in [*args, *kwargs.values()]):
        unsupported(f"{what} with non-constant arguments", BreakReason.UNSUPPORTED_CALL)
    return ([a.as_python_constant() for a in args],
            {k: v.as_python_constant() for k, v in kwargs.items()})


def wrap_numpy_constant(value: Any, what: str) -> VariableTracker:
    """A tracker for a value numpy computed at trace time from constants."""
    if is_constant_value(value):
        return ConstantVariable(value=value)
    if isinstance(value, (np.generic, np.dtype, np.finfo, np.iinfo)):
        return NumpyConstVariable(value=value)
    if isinstance(value, type) and issubclass(value, np.generic):
        return NumpyFunctionVariable(value=value)
    if type(value) in (tuple, list):
        from ferrodyn.variables.lists import ListVariable, TupleVariable
        items = [wrap_numpy_constant(v, what) for v in value]
        return TupleVariable(items=tuple(items)) if type(value) is tuple else ListVariable.new(items)
    unsupported(f"{what} gave a {type(value).__name__}", BreakReason.UNSUPPORTED_TYPE)


# Attributes computed from the data (graph nodes); every other attribute is numpy's answer
# on the oracle (shape, size, strides, dtype, ...).
_GRAPH_ATTRS = frozenset({"T", "mT", "real", "imag"})
_REFUSED_ATTRS = {
    "flags": BreakReason.UNSUPPORTED_TYPE, "base": BreakReason.UNSUPPORTED_TYPE,
    "ctypes": BreakReason.UNSUPPORTED_TYPE, "data": BreakReason.UNSUPPORTED_TYPE,
    "flat": BreakReason.UNSUPPORTED_TYPE, "__array_interface__": BreakReason.UNSUPPORTED_TYPE,
}
_REFUSED_METHODS = {
    "tofile": BreakReason.SIDE_EFFECT, "dump": BreakReason.SIDE_EFFECT,
    "dumps": BreakReason.UNSUPPORTED_CALL, "tobytes": BreakReason.DATA_DEPENDENT,
    "tolist": BreakReason.DATA_DEPENDENT, "item": BreakReason.DATA_DEPENDENT,
    "__array__": BreakReason.UNSUPPORTED_CALL, "resize": BreakReason.SIDE_EFFECT,
    "setflags": BreakReason.SIDE_EFFECT, "view": BreakReason.UNSUPPORTED_CALL,
    "__bool__": BreakReason.DATA_DEPENDENT, "__int__": BreakReason.DATA_DEPENDENT,
    "__float__": BreakReason.DATA_DEPENDENT, "__index__": BreakReason.DATA_DEPENDENT,
}


@dataclass(frozen=True, eq=False)
class NumpyFunctionVariable(_NumpyValueVariable):
    """A numpy callable: a function, a ufunc, a scalar type (`np.float32`), `np.dtype`."""

    def describe(self) -> str:
        return f"numpy {getattr(self.value, '__name__', self.value)}"

    def var_getattr(self, tx, name):
        attr = _run_eager(lambda: getattr(self.value, name), f"attribute {name!r}")
        from ferrodyn.variables.builder import build_unsourced
        return build_unsourced(attr)

    def call_function(self, tx, args, kwargs):
        return call_numpy_function(tx, self.value, args, kwargs)


# numpy callables that are pure on constants (dtype queries): folded at trace time.
_FOLDABLE = frozenset({
    np.dtype, np.finfo, np.iinfo, np.issubdtype, np.result_type, np.promote_types, np.can_cast,
    np.isdtype if hasattr(np, "isdtype") else np.dtype, np.min_scalar_type,
})


def _module_of(fn: Any) -> str:
    mod = getattr(fn, "__module__", None)
    return mod if isinstance(mod, str) else ""


def _in_numpy(module: str) -> bool:
    return module == "numpy" or module.startswith("numpy.")


def _tnp_equivalent(fn: Any) -> Callable | None:
    """The `torch._numpy` function standing for numpy callable `fn` (same module path)."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str):
        return None
    for np_mod, t_mod in ((np.linalg, tnp.linalg), (np.fft, tnp.fft), (np, tnp)):
        if getattr(np_mod, name, None) is fn:
            return getattr(t_mod, name, None)
    return None


def call_numpy_function(tx, fn: Any, args, kwargs) -> VariableTracker:
    args = [tx.realize(a) for a in args]
    kwargs = {k: tx.realize(v) for k, v in kwargs.items()}
    name = getattr(fn, "__name__", repr(fn))
    if _module_of(fn).startswith("numpy.random.") or getattr(np.random, name, None) is fn:
        unsupported(f"np.random.{name}: numpy's global random state is not traced",
                    BreakReason.UNSUPPORTED_CALL)
    all_const = all(a.is_python_constant() for a in [*args, *kwargs.values()])
    if all_const and (fn in _FOLDABLE or isinstance(fn, type) and issubclass(fn, np.generic)
                      or isinstance(fn, np.ufunc) and _scalar_constants(args, kwargs)):
        pos, kw = _constant_args(args, kwargs, name)
        return wrap_numpy_constant(_run_eager(lambda: fn(*pos, **kw), f"np.{name}"), f"np.{name}")
    if isinstance(fn, type) and not issubclass(fn, np.generic):
        unsupported(f"constructing numpy {name} from traced values", BreakReason.UNSUPPORTED_CALL)
    if "out" in kwargs:
        unsupported(f"np.{name}(out=...)", BreakReason.SIDE_EFFECT)
    target = _tnp_equivalent(fn)
    if target is None:
        unsupported(f"np.{name}: no torch._numpy equivalent", BreakReason.UNSUPPORTED_CALL)
    return numpy_op(tx, NumpyCall(target, name), args, kwargs, fn, f"np.{name}")


def _scalar_constants(args, kwargs) -> bool:
    """Every argument a number or a numpy scalar: a ufunc on them returns a numpy scalar that
    numpy computes once at trace time, exactly (`np.sqrt(self.d_model)`), instead of a 0-d
    array traced through torch._numpy (which a tensor op then refuses)."""
    scalar = (bool, int, float, complex, np.generic)
    return "out" not in kwargs and all(
        isinstance(v.as_python_constant(), scalar) for v in [*args, *kwargs.values()])


# ---- recording one numpy operation ------------------------------------------------------------

class _Args:
    """Converts trackers into (fx argument, fake value, oracle value) triples; remembers the
    array inputs (for aliasing and identity checks)."""

    def __init__(self, tx, what: str):
        self.tx, self.what = tx, what
        self.arrays: list[tuple[VariableTracker, Any, Any]] = []  # (tracker, fake, oracle)

    def convert(self, v: VariableTracker):
        from ferrodyn.variables.lists import ListVariable, TupleVariable
        from ferrodyn.variables.tensor import TensorVariable
        tx = self.tx
        v = tx.realize(v)
        if isinstance(v, NdarrayVariable):
            for seen, _, oracle in self.arrays:  # one array passed twice: one oracle object
                if seen is v:
                    return v.node, v.example, oracle
            oracle = v.oracle_value()
            self.arrays.append((v, v.example, oracle))
            return v.node, v.example, oracle
        if isinstance(v, TensorVariable):  # numpy converts a tensor through __array__
            ex = v.example
            if ex.requires_grad or ex.device.type != "cpu" or ex.is_conj() or ex.is_neg():
                unsupported(f"{self.what}: a tensor numpy cannot convert "
                            f"(requires_grad, device or conj/neg bit)", BreakReason.EXCEPTION)
            # a real tensor of zeros: numpy converts it, or (np.mean, np.sum, np.transpose...)
            # calls the tensor's own method and returns a tensor
            _np_dtype(ex.dtype, self.what)
            oracle = torch.empty_strided(_concrete_shape(ex, self.what), tuple(ex.stride()),
                                         dtype=ex.dtype).zero_()
            self.arrays.append((v, ex, oracle))
            return v.node, ex, oracle
        if isinstance(v, NumpyConstVariable) and isinstance(v.value, np.generic):
            return self._scalar_input(v.value)
        if isinstance(v, _NumpyValueVariable):
            val = v.value
            if isinstance(val, np.dtype) or isinstance(val, type) and issubclass(val, np.generic):
                dt = np.dtype(val)
                if dt not in NP_TO_TORCH:
                    unsupported(f"{self.what}: dtype {dt}", BreakReason.UNSUPPORTED_TYPE)
                return dt.name, dt.name, val
            unsupported(f"{self.what}: argument {v.describe()}", BreakReason.UNSUPPORTED_TYPE)
        if isinstance(v, (ListVariable, TupleVariable)):
            parts = [self.convert(i) for i in v.unpack(tx)]
            kind = list if isinstance(v, ListVariable) else tuple
            return tuple(kind(p[i] for p in parts) for i in range(3))
        if isinstance(v, ConstantVariable) and is_constant_value(v.value) and \
                not isinstance(v.value, (torch.dtype, torch.device, torch.Size)):
            return v.value, v.value, v.value
        unsupported(f"{self.what}: argument {v.describe()}", BreakReason.UNSUPPORTED_TYPE)

    def _scalar_input(self, value: np.generic):
        """A numpy scalar known at trace time: a 0-d tensor in the graph (numpy scalars take
        part in dtype promotion like arrays, unlike Python numbers)."""
        dt = NP_TO_TORCH.get(value.dtype)
        if dt is None:
            unsupported(f"{self.what}: numpy scalar of dtype {value.dtype}",
                        BreakReason.UNSUPPORTED_TYPE)
        py = value.item()
        fake = self.tx.output.run_fake(lambda: torch.tensor(py, dtype=dt))
        node = self.tx.output.create_node("call_function", torch.tensor, (py,), {"dtype": dt})
        node.meta["example_value"] = fake
        return node, fake, value


def numpy_op(tx, target: NumpyTarget, args, kwargs, eager: Callable, what: str):
    """Record `target(*args, **kwargs)` (a torch._numpy call on graph tensors) after checking
    it against `eager` (the real numpy callable) run on the oracle's zeros."""
    conv = _Args(tx, what)
    triples = [conv.convert(a) for a in args]
    ktriples = {k: conv.convert(v) for k, v in kwargs.items()}
    fx_a = tuple(t[0] for t in triples)
    fx_k = {k: t[0] for k, t in ktriples.items()}
    fake_a = [t[1] for t in triples]
    fake_k = {k: t[1] for k, t in ktriples.items()}
    versions = [f._version for _, f, _ in conv.arrays]
    try:
        fake_out = tx.output.run_fake(lambda: target(*fake_a, **fake_k))
    except Unsupported:
        raise
    except Exception as e:
        reason = BreakReason.DATA_DEPENDENT if "data" in str(e) and "depend" in str(e) \
            else BreakReason.EXCEPTION
        if type(e).__name__ in ("DataDependentOutputException", "DynamicOutputShapeException"):
            reason = BreakReason.DATA_DEPENDENT
        unsupported(f"{what} in torch._numpy raised {type(e).__name__}: {e}", reason)
    eager_out = _run_eager(lambda: eager(*[t[2] for t in triples],
                                         **{k: t[2] for k, t in ktriples.items()}), what)
    mutated = [f._version != v for (_, f, _), v in zip(conv.arrays, versions)]
    if any(mutated) != _numpy_writes(conv, triples, ktriples, eager):
        unsupported(f"{what}: {'torch._numpy' if any(mutated) else 'numpy'} writes to an "
                    f"input, {'numpy' if any(mutated) else 'torch._numpy'} does not",
                    BreakReason.SIDE_EFFECT)
    if any(mutated):
        for (tracker, _, _), m in zip(conv.arrays, mutated):
            if m and (not isinstance(tracker, NdarrayVariable) or tracker.scalar):
                unsupported(f"{what}: writes to {tracker.describe()} (numpy writes to a copy)",
                            BreakReason.SIDE_EFFECT)
        target = target.as_inplace()
        tx.output.mutation_epoch += 1
    node = tx.output.create_node("call_function", target, fx_a, fx_k)
    return _wrap(tx, node, fake_out, eager_out, conv, what, keep=any(mutated))


def _numpy_writes(conv: _Args, triples, ktriples, eager: Callable) -> bool:
    """Whether numpy writes to an array argument: the call again with read-only copies of
    the array arguments raises numpy's read-only error."""
    frozen: dict[int, Any] = {}
    for _, _, o in conv.arrays:
        if isinstance(o, np.ndarray):
            c = o.copy()
            c.flags.writeable = False
            frozen[id(o)] = c

    def swap(v):
        if type(v) in (list, tuple):
            return type(v)(swap(i) for i in v)
        return frozen.get(id(v), v)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            eager(*[swap(t[2]) for t in triples], **{k: swap(t[2]) for k, t in ktriples.items()})
        except ValueError as e:
            return "read-only" in str(e)
        except Exception:
            return False
    return False


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())


def _wrap(tx, node, fake, eager, conv: _Args, what: str, keep: bool) -> VariableTracker:
    """The tracker of one result: numpy's answer (`eager`, on the oracle's zeros) says what it
    is, the graph (`node`, example `fake`) holds its data."""
    if isinstance(eager, (np.ndarray, np.generic)):
        if type(eager) is not np.ndarray and not isinstance(eager, np.generic):
            unsupported(f"{what} gave a {type(eager).__name__}", BreakReason.UNSUPPORTED_TYPE)
        if not isinstance(fake, torch.Tensor):
            unsupported(f"{what}: torch._numpy gave {type(fake).__name__} where numpy gives "
                        f"an array", BreakReason.UNSUPPORTED_TYPE)
        shape = () if isinstance(eager, np.generic) else eager.shape
        if TORCH_TO_NP.get(fake.dtype) != eager.dtype or tuple(fake.shape) != tuple(shape):
            unsupported(f"{what}: torch._numpy gives {fake.dtype}{list(fake.shape)}, numpy "
                        f"{eager.dtype}{list(shape)}", BreakReason.UNSUPPORTED_TYPE)
        for tracker, f_in, o_in in conv.arrays:
            if eager is o_in:  # numpy returned its input itself (`a += 1`, `a.real`)
                if fake is not f_in:
                    unsupported(f"{what}: numpy returns its input, torch._numpy a new array",
                                BreakReason.UNSUPPORTED_TYPE)
                return tracker
        if isinstance(eager, np.ndarray):
            for tracker, f_in, o_in in conv.arrays:
                if isinstance(o_in, (np.ndarray, torch.Tensor)) and \
                        np.shares_memory(eager, o_in) != _same_storage(fake, f_in):
                    unsupported(f"{what}: numpy's result {'is' if np.shares_memory(eager, o_in) else 'is not'} "
                                f"a view of {tracker.describe()}, torch._numpy's "
                                f"{'is not' if np.shares_memory(eager, o_in) else 'is'}",
                                BreakReason.UNSUPPORTED_TYPE)
        if isinstance(eager, np.generic) and \
                any(_same_storage(fake, f_in) for _, f_in, _ in conv.arrays):
            # a numpy scalar is an immutable copy; torch._numpy's 0-d result may be a view
            # that a later write to the array would change
            node = tx.output.create_node("call_function", torch.clone, (node,), {})
            fake = tx.output.run_fake(lambda: torch.clone(fake))
        elif any(fake is f_in for _, f_in, _ in conv.arrays):  # a new object, the same data
            node = tx.output.create_node("call_function", torch.ops.aten.alias.default, (node,), {})
            fake = tx.output.run_fake(lambda: torch.ops.aten.alias.default(fake))
        node.meta["example_value"] = fake
        strides = None
        if isinstance(eager, np.ndarray):
            item = eager.dtype.itemsize
            if tuple(eager.strides) != tuple(int(s) * item for s in fake.stride()):
                strides = tuple(eager.strides)
        return NdarrayVariable(node=node, example=fake, np_type=type(eager), np_strides=strides,
                               writeable=not isinstance(eager, np.ndarray) or
                               bool(eager.flags.writeable))
    if type(eager) in (tuple, list):
        if type(fake) not in (tuple, list) or len(fake) != len(eager):
            unsupported(f"{what}: torch._numpy's result does not match numpy's {type(eager).__name__}",
                        BreakReason.UNSUPPORTED_TYPE)
        node.meta["example_value"] = fake
        items = []
        for i, (f, e) in enumerate(zip(fake, eager)):
            item = tx.output.create_node("call_function", operator.getitem, (node, i), {}) \
                if isinstance(f, (torch.Tensor, list, tuple)) else node
            items.append(_wrap(tx, item, f, e, conv, what, keep=True))
        from ferrodyn.variables.lists import ListVariable, TupleVariable
        return TupleVariable(items=tuple(items)) if type(eager) is tuple else ListVariable.new(items)
    if isinstance(fake, torch.Tensor):
        unsupported(f"{what}: numpy gives a {type(eager).__name__} computed from the data",
                    BreakReason.DATA_DEPENDENT)
    if not (is_constant_value(eager) and type(fake) is type(eager) and fake == eager):
        unsupported(f"{what}: torch._numpy gives {fake!r}, numpy {eager!r}",
                    BreakReason.UNSUPPORTED_TYPE)
    if not keep and not node.users and node.op == "call_function" and eager is not None:
        tx.output.graph.erase_node(node)
    return ConstantVariable(value=eager)


# ---- entry points for other modules -----------------------------------------------------------

def tensor_numpy(tx, tensor, args, kwargs) -> VariableTracker:
    """`t.numpy()`: an ndarray sharing `t`'s memory (a `detach` node: the same storage)."""
    force = False
    if args or set(kwargs) - {"force"}:
        unsupported("Tensor.numpy() with arguments", BreakReason.UNSUPPORTED_CALL)
    if "force" in kwargs:
        f = tx.realize(kwargs["force"])
        if not f.is_python_constant():
            unsupported("Tensor.numpy(force=<traced>)", BreakReason.DATA_DEPENDENT)
        force = bool(f.as_python_constant())
    ex = tensor.example
    if ex.requires_grad or ex.device.type != "cpu" or ex.is_conj() or ex.is_neg() or \
            ex.layout is not torch.strided or ex.dtype not in TORCH_TO_NP:
        unsupported(f"Tensor.numpy({'force=True' if force else ''}) of a tensor that "
                    f"{'needs a copy' if force else 'numpy() rejects'} (grad, device, dtype or "
                    f"layout)", BreakReason.EXCEPTION)
    _concrete_shape(ex, "Tensor.numpy()")
    fake = tx.output.run_fake(lambda: torch.detach(ex))
    node = tx.output.create_node("call_function", torch.detach, (tensor.node,), {})
    node.meta["example_value"] = fake
    return NdarrayVariable(node=node, example=fake)


def torch_from_numpy(tx, args, kwargs) -> VariableTracker:
    """`torch.from_numpy(a)`: a tensor sharing `a`'s memory."""
    from ferrodyn.variables.tensor import TensorVariable
    a = tx.realize(args[0]) if len(args) == 1 and not kwargs else None
    if not isinstance(a, NdarrayVariable) or a.scalar or a.np_strides is not None:
        unsupported("torch.from_numpy of a value that is not a traced ndarray in the graph's "
                    "layout", BreakReason.UNSUPPORTED_TYPE)
    fake = tx.output.run_fake(lambda: torch.detach(a.example))
    node = tx.output.create_node("call_function", torch.detach, (a.node,), {})
    node.meta["example_value"] = fake
    return TensorVariable(node=node, example=fake)


def torch_number(value: Any, what: str) -> Any:
    """The Python number torch's argument parser reads a numpy scalar as, when a tensor
    operator gets one: numpy integers through `__index__` (an int), `np.complex128` as the
    Python complex it subclasses, every other numpy scalar through `__float__` (`np.bool_`
    and `np.float32` too: `int_tensor * np.bool_(True)` is float in eager). numpy's other
    complex scalars (`__float__` drops the imaginary part with a ComplexWarning) are refused."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, complex):
        return complex(value)
    if isinstance(value, np.complexfloating) or not isinstance(value, np.generic):
        unsupported(f"{what} with a numpy {type(value).__name__} and a tensor",
                    BreakReason.UNSUPPORTED_TYPE)
    return float(value)


def _is_numpy_operand(v) -> bool:
    return isinstance(v, NdarrayVariable) or \
        isinstance(v, NumpyConstVariable) and isinstance(v.value, np.generic)


_INPLACE_BASE = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod, operator.ipow: operator.pow, operator.imatmul: operator.matmul,
    operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
    operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor,
}


def numpy_operator(tx, fn: Callable, *operands) -> VariableTracker | None:
    """A Python operator (binary, in-place, comparison or unary) with a numpy operand; None when
    no operand is numpy's (operators.py goes on)."""
    from ferrodyn.variables.tensor import TensorVariable, record_op
    if not any(_is_numpy_operand(v) for v in operands):
        return None
    a = operands[0]
    if fn in _INPLACE_BASE and (isinstance(a, NumpyConstVariable) or
                                isinstance(a, NdarrayVariable) and a.scalar):
        fn = _INPLACE_BASE[fn]  # numpy scalars have no in-place methods: `s += 1` rebinds
    what = f"operator {fn.__name__}"
    if any(isinstance(v, TensorVariable) for v in operands):
        if any(isinstance(v, NdarrayVariable) for v in operands):
            unsupported(f"{what} between a tensor and an ndarray", BreakReason.UNSUPPORTED_TYPE)
        # a known numpy scalar with a tensor (`t *= s` stays in place on the tensor)
        args = [ConstantVariable(value=torch_number(v.value, what))
                if isinstance(v, NumpyConstVariable) else v for v in operands]
        return record_op(tx, "call_function", fn, args, {})
    if all(v.is_python_constant() for v in operands):
        vals = [v.as_python_constant() for v in operands]
        return wrap_numpy_constant(_run_eager(lambda: fn(*vals), what), what)
    return numpy_op(tx, NumpyOperator(fn), list(operands), {}, fn, what)


def _is_numpy_callable(value: Any) -> bool:
    if isinstance(value, np.ufunc):
        return True
    if isinstance(value, type):
        return issubclass(value, np.generic) or value in (np.dtype, np.finfo, np.iinfo)
    if not callable(value):
        return False
    if _in_numpy(_module_of(value)):
        return True
    self_ = getattr(value, "__self__", None)  # np.random.randn: a method of the global RandomState
    return isinstance(self_, np.random.RandomState)


def is_numpy_value(value: Any) -> bool:
    """Cheap test the builder runs on every value: is it (maybe) numpy's?"""
    t = type(value)
    if _in_numpy(t.__module__):
        return True
    if t is _BUILTIN_METHOD and isinstance(getattr(value, "__self__", None), np.random.RandomState):
        return True
    return callable(value) and _in_numpy(_module_of(value))


_BUILTIN_METHOD = type(len)


def build_numpy(tx, value: Any, source: Source | None) -> VariableTracker | None:
    """The tracker of a numpy value from the frame (None: not numpy's). ndarrays become graph
    inputs guarded by type, dtype, shape, strides and writeability; numpy scalars, dtypes and
    callables are guarded by identity."""
    t = type(value)
    if t is np.ndarray:
        return _ndarray_input(tx, value, source)
    if isinstance(value, np.ndarray):
        unsupported(f"ndarray subclass {t.__name__}", BreakReason.UNSUPPORTED_TYPE)
    if isinstance(value, (np.generic, np.dtype, np.finfo, np.iinfo)):
        var = NumpyConstVariable(source=source, value=value)
    elif not isinstance(value, type(np)) and _is_numpy_callable(value):
        var = NumpyFunctionVariable(source=source, value=value)
    else:
        return None
    if source is None:
        return var
    if isinstance(value, np.generic) and value.dtype.char in _BUFFER_SCALARS:
        # by type and value: `x.data[()]` is the Python number in a scalar's buffer
        from ferrodyn.source import ItemSource
        tx.output.install_guard(source, GuardKind.TYPE_MATCH, type(value))
        tx.output.install_guard(ItemSource(AttrSource(source, "data"), ()), GuardKind.EQUALS,
                                value.item())
    else:
        tx.output.install_guard(source, GuardKind.ID_MATCH, value)
    return var


# numpy scalar dtypes whose buffer a memoryview reads back as a Python bool/int/float
_BUFFER_SCALARS = frozenset("?bBhHiIlLqQfd")


def build_numpy_unsourced(value: Any) -> VariableTracker | None:
    if isinstance(value, (np.generic, np.dtype, np.finfo, np.iinfo)):
        return NumpyConstVariable(value=value)
    if not isinstance(value, (type(np), np.ndarray)) and _is_numpy_callable(value):
        return NumpyFunctionVariable(value=value)
    return None


def _ndarray_input(tx, value: np.ndarray, source: Source) -> VariableTracker:
    if source is None:
        unsupported("an ndarray that cannot be reached from the frame", BreakReason.UNSUPPORTED_TYPE)
    if value.dtype not in NP_TO_TORCH:
        unsupported(f"ndarray of dtype {value.dtype} at {source.name()}", BreakReason.UNSUPPORTED_TYPE)
    try:
        tensor = ndarray_as_tensor(value)
    except Exception as e:  # negative strides, misaligned data
        unsupported(f"ndarray at {source.name()}: {e}", BreakReason.UNSUPPORTED_TYPE)
    guard = tx.output.install_guard
    guard(source, GuardKind.TYPE_MATCH, np.ndarray)
    guard(AttrSource(AttrSource(source, "dtype"), "str"), GuardKind.EQUALS, value.dtype.str)
    guard(AttrSource(source, "shape"), GuardKind.EQUALS, tuple(value.shape))
    guard(AttrSource(source, "strides"), GuardKind.EQUALS, tuple(value.strides))
    writeable = bool(value.flags.writeable)
    guard(AttrSource(AttrSource(source, "flags"), "writeable"), GuardKind.EQUALS, writeable)
    node, fake = tx.output.add_graph_input(NumpyTensorSource(source), tensor)
    return NdarrayVariable(source=source, node=node, example=fake, writeable=writeable)

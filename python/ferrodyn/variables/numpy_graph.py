"""What runs inside a graph traced from numpy code, and at its edges.

Owns the fx call targets of traced numpy operations (`NumpyCall`, `NumpyMethod`,
`NumpyOperator`: run the `torch._numpy` equivalent on tensors, with float64 as torch's default
float dtype as numpy's, and hand tensors back), the conversions at the graph's edges
(`ndarray_as_tensor` for ndarray frame inputs, `NumpyTensorSource` naming them,
`ndarray_output` turning an output tensor into the ndarray or numpy scalar eager numpy gives),
and the torch <-> numpy dtype table. Does not decide what is traced (numpy_vars.py).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import torch
import torch._numpy as tnp

from ferrodyn.source import Source, source_class

# torch dtype <-> numpy dtype for the dtypes both have (others refuse).
TORCH_TO_NP = {
    torch.bool: np.dtype(np.bool_), torch.uint8: np.dtype(np.uint8), torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16), torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64), torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64), torch.complex128: np.dtype(np.complex128),
}
NP_TO_TORCH = {v: k for k, v in TORCH_TO_NP.items()}


# ---- graph targets: run torch._numpy on tensors, hand tensors back ----------------------------

def _to_tnp(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tnp.ndarray(value)
    if type(value) in (list, tuple):
        return type(value)(_to_tnp(v) for v in value)
    return value


def _to_tensor(value: Any) -> Any:
    if isinstance(value, tnp.ndarray):
        return value.tensor
    if isinstance(value, (list, tuple)):
        return type(value)(_to_tensor(v) for v in value)
    return value


class _numpy_default_dtype:
    """torch's default float dtype set to numpy's (float64) while a torch._numpy op runs: torch
    ops it calls pick their float results by it (`int_array / 2` is float64 in numpy)."""

    def __enter__(self):
        self.prior = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.prior)


class NumpyTarget:
    """Base of the fx targets: callables with a readable name (`np_mean`, `ndarray_copy`);
    a name ending in `_` marks an in-place node (tensor._is_inplace)."""

    def __init__(self, name: str, inplace: bool):
        self.__name__ = name + ("_" if inplace else "")
        self.__qualname__ = self.__name__

    def as_inplace(self) -> "NumpyTarget":
        """The same operation, named as one that writes to an input."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        if not new.__name__.endswith("_"):
            new.__name__ = new.__qualname__ = new.__name__ + "_"
        return new

    def __repr__(self) -> str:
        return f"<ferrodyn numpy op {self.__name__}>"


class NumpyCall(NumpyTarget):
    """`fn(*args)` for a `torch._numpy` function."""

    def __init__(self, fn: Callable, name: str, inplace: bool = False):
        super().__init__("np_" + name, inplace)
        self.fn = fn

    def __call__(self, *args, **kwargs):
        with _numpy_default_dtype():
            return _to_tensor(self.fn(*_to_tnp(args), **_to_tnp(kwargs)))


class NumpyMethod(NumpyTarget):
    """`ndarray.name(*args)` (or the attribute `name` when `attr`)."""

    def __init__(self, name: str, inplace: bool = False, attr: bool = False):
        super().__init__("ndarray_" + name.strip("_"), inplace)
        self.name, self.attr = name, attr

    def __call__(self, obj, *args, **kwargs):
        with _numpy_default_dtype():
            value = getattr(tnp.ndarray(obj), self.name)
            if self.attr:
                return _to_tensor(value)
            return _to_tensor(value(*_to_tnp(args), **_to_tnp(kwargs)))


class NumpyOperator(NumpyTarget):
    """A Python operator (`operator.add`, `operator.setitem`) between ndarrays."""

    def __init__(self, op: Callable, inplace: bool = False):
        super().__init__("ndarray_op_" + op.__name__.strip("_"), inplace)
        self.op = op

    def __call__(self, *args):
        with _numpy_default_dtype():
            return _to_tensor(self.op(*_to_tnp(args)))


def ndarray_output(t: torch.Tensor, scalar: bool, strides: tuple | None, readonly: bool) -> Any:
    """The real numpy value of a graph output: `t.numpy()` (memory shared with `t`), its
    numpy scalar when eager numpy gives one, with numpy's byte `strides` where they differ from
    the tensor's (the same memory when only size-1 dimensions differ, else a copy in numpy's
    layout: numpy's result was a new array then), read-only when numpy's is."""
    a = t.detach().numpy() if t.requires_grad else t.numpy()
    if scalar:
        return a[()]
    if strides is not None and a.strides != strides:
        same_memory = all(x == y or n <= 1 for x, y, n in zip(a.strides, strides, a.shape))
        if not same_memory:
            if np.empty(a.shape, a.dtype, order="C").strides == strides:
                a = np.ascontiguousarray(a)
            elif np.empty(a.shape, a.dtype, order="F").strides == strides:
                a = np.asfortranarray(a)
            else:
                b = np.empty_like(a, order="K")
                a = _restride(b, strides)
                a[...] = t.numpy()
        if a.strides != strides:
            a = _restride(a, strides)
    if readonly:
        a.flags.writeable = False
    return a


def _restride(a: np.ndarray, strides: tuple) -> np.ndarray:
    """`a`'s memory viewed with `strides` (that address the same elements of it)."""
    return np.lib.stride_tricks.as_strided(a, a.shape, strides, writeable=True)


def ndarray_as_tensor(a: np.ndarray) -> torch.Tensor:
    """The graph input of an ndarray frame value: a tensor sharing its memory."""
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():  # "non-writable": the graph never writes to it (refused)
        warnings.simplefilter("ignore")
        return torch.from_numpy(a)


@source_class
class NumpyTensorSource(Source):
    """`torch.as_tensor(base)` of an ndarray frame value (loaded by codegen through
    `ndarray_as_tensor`); its shapes stay static (the ndarray's guards pin them)."""
    base: Source
    static_shapes = True

    def name(self) -> str:
        return f"torch.as_tensor({self.base.name()})"

    def root(self) -> Source:
        return self.base.root()

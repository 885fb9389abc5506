"""numpy scalars meeting tensors in Python operators, and numpy ufuncs on constants.

Two wrong-value classes fixed here:
- a numpy scalar operand was handed to torch as `value.item()`, but torch's argument parser
  reads `np.bool_`, `np.float16/32` and `np.longdouble` through `__float__`: `int_tensor *
  np.bool_(True)` is float32 in eager and came back int32;
- `t += np.float32(1)` on a TENSOR was recorded as `t = t + s` (the rule for numpy scalars,
  which have no in-place methods), so aliases of `t` kept their old values and `int_t +=
  np.float32(1)` returned a float tensor where eager raises.

And a capture gap: `x *= np.sqrt(self.d_model)` (transformers' CTRL) traced `np.sqrt` of an int
into the graph as a 0-d array, then refused the tensor-ndarray product: 3 graph breaks where
torch.compile makes none. A ufunc on number constants now folds to numpy's own scalar."""

from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

_SCALARS = [np.float32(3), np.float64(2.5), np.int64(2), np.int32(3), np.uint8(3), np.bool_(True),
            np.float16(1.5), np.longdouble(2), np.complex128(1 + 2j)]
_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64, torch.bool,
           torch.uint8]
_BINARY = {"mul": operator.mul, "add": operator.add, "sub": operator.sub,
           "truediv": operator.truediv, "floordiv": operator.floordiv, "pow": operator.pow,
           "lt": operator.lt}
_INPLACE = {"iadd": operator.iadd, "imul": operator.imul, "isub": operator.isub}


def _outcome(fn, *args):
    try:
        r = fn(*args)
    except Exception as e:  # noqa: BLE001 - the exception's type is the outcome compared
        return ("raises", type(e))
    return ("value", r)


def _same(a, b):
    if a[0] != b[0]:
        return False
    if a[0] == "raises":
        return a[1] is b[1]
    x, y = a[1], b[1]
    if isinstance(x, tuple):
        return type(y) is tuple and len(x) == len(y) and all(
            _same(("value", p), ("value", q)) for p, q in zip(x, y))
    if type(x) is not type(y) or x.dtype != y.dtype:
        return False
    if x.dtype == torch.complex32:  # torch.equal has no ComplexHalf kernel
        x, y = x.to(torch.complex64), y.to(torch.complex64)
    return torch.equal(x, y)


def _check(fn, make_args):
    ref = _outcome(fn, *make_args())
    ferrodyn.reset()
    out = _outcome(ferrodyn.compile(fn, backend="eager"), *make_args())
    assert _same(ref, out), (ref, out)


@pytest.mark.parametrize("scalar", _SCALARS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("name", list(_BINARY))
def test_tensor_operator_numpy_scalar_matches_eager_for_every_dtype(scalar, name):
    op = _BINARY[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 1 // 0 style warnings of eager
        for dt in _DTYPES:
            _check(lambda x, s=scalar: (op(x, s), op(s, x)), lambda: (torch.ones(3, dtype=dt),))


@pytest.mark.parametrize("scalar", _SCALARS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("name", list(_INPLACE))
def test_inplace_operator_on_a_tensor_stays_in_place(scalar, name):
    op = _INPLACE[name]

    def fn(x, s=scalar):
        alias = x
        y = x.view(-1)
        x = op(x, s)  # `x += s`: the tensor itself changes, its alias and view see it
        return x, alias, y, x is alias

    for dt in _DTYPES:
        eager_x = torch.ones(2, 2, dtype=dt)
        ferrodyn_x = eager_x.clone()
        ref = _outcome(fn, eager_x)
        ferrodyn.reset()
        out = _outcome(ferrodyn.compile(fn, backend="eager"), ferrodyn_x)
        assert ref[0] == out[0], (dt, ref, out)
        if ref[0] == "raises":
            assert ref[1] is out[1]
        else:
            assert _same(("value", ref[1][:3]), ("value", out[1][:3]))
            assert ref[1][3] is out[1][3] is True
        assert torch.equal(eager_x, ferrodyn_x) and eager_x.dtype == ferrodyn_x.dtype


def test_numpy_complex64_with_a_tensor_is_refused_not_truncated():
    def fn(x):
        return x * np.complex64(1 + 2j)

    backend = CountingBackend()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = fn(torch.ones(3))
        out = ferrodyn.compile(fn, backend=backend)(torch.ones(3))
    torch.testing.assert_close(out, ref)
    assert backend.count == 0  # the frame ran eagerly (eager warns and drops the imaginary part)


def test_ufunc_of_constants_folds_like_torch_compile():
    def fn(x, d):
        x = x * 2
        x *= np.sqrt(d)
        return x * np.float32(3) + np.pi * np.sqrt(4.0) + x * np.int64(2) * np.log(np.float64(2))

    x = torch.randn(3)
    ref = fn(x.clone(), 16)
    torch._dynamo.reset()
    tb = CountingBackend()
    torch.testing.assert_close(torch.compile(fn, backend=tb)(x.clone(), 16), ref)
    fb = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=fb)
    torch.testing.assert_close(compiled(x.clone(), 16), ref)
    assert fb.count == tb.count == 1
    torch.testing.assert_close(compiled(x.clone(), 25), fn(x.clone(), 25))  # guarded constant


def test_ufunc_of_a_list_constant_still_traces_an_array():
    def fn(x):
        a = np.sqrt([4.0, 9.0])  # an ndarray result: not folded to a scalar
        return x + torch.from_numpy(a)

    x = torch.zeros(2, dtype=torch.float64)
    torch.testing.assert_close(ferrodyn.compile(fn, backend="eager")(x), fn(x))

"""numpy inside compiled functions (variables/numpy_vars.py): ndarrays and numpy calls traced
through torch._numpy, compared with eager on the same inputs (values, dtypes, numpy scalar vs
0-d array, strides, read-only flags, memory shared with tensors and inputs, mutated inputs) and
graph counts compared with torch.compile's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend


def _same(a, b, path="out"):
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        assert a.strides == b.strides, f"{path}: strides {a.strides} vs {b.strides}"
        assert a.flags.writeable == b.flags.writeable, f"{path}: writeable"
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=path)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype, f"{path}: {a.dtype} vs {b.dtype}"
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=path)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), path
        torch.testing.assert_close(a, b, msg=path)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def _copy(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    return copy.deepcopy(v)


def run_both(fn, *args, torch_too=True):
    """fn eager, under ferrodyn.compile and torch.compile, each on its own copy of `args`:
    asserts equal results and equally mutated arguments; returns (ferrodyn, torch) graph counts."""
    eager_args = [_copy(a) for a in args]
    expected = fn(*eager_args)
    fd = CountingBackend()
    fd_args = [_copy(a) for a in args]
    got = ferrodyn.compile(fn, backend=fd)(*fd_args)
    _same(expected, got)
    _same(eager_args, fd_args, "args")
    tc = None
    if torch_too:
        torch._dynamo.reset()
        tcb = CountingBackend()
        torch.compile(fn, backend=tcb)(*[_copy(a) for a in args])
        tc = tcb.count
    return fd.count, tc


def _np_meshgrid(x, y):
    r1, r2 = np.meshgrid(x.numpy(), y.numpy())
    return torch.from_numpy(r1), torch.from_numpy(r2)


def _np_attributes(x):
    a = x.numpy()
    return (a.itemsize, a.strides, a.shape, a.ndim, a.size, torch.from_numpy(a.T),
            torch.from_numpy(a.real), torch.from_numpy(a.imag))


def _mean_sum(x):
    x_sum = np.sum(np.mean(x.numpy(), 1))
    return torch.from_numpy(np.asarray(x_sum))


def _methods_returning_scalar(x):
    a = x.numpy()
    return a.max(axis=0), a.all(axis=0), np.sum(a), a.sum(), np.asarray(a.sum())


def _dtype_argument(x):
    return np.ones_like(x, dtype=np.float64)


def _dtype_call(x):
    dt = np.dtype("float")
    return np.full_like(x, 2.4, dtype=dt)


def _finfo(x):
    return x + np.finfo(np.float32).min


def _dtype_rules(x):
    a = x.numpy()
    return a / 2, np.arange(5), np.zeros(3), a * 1.5, a + np.float32(1), a.astype(np.int8)


CASES = {
    "meshgrid": (_np_meshgrid, lambda: (torch.arange(3.0), torch.arange(2.0))),
    "size": (lambda x: x.numpy().size, lambda: (torch.randn(3, 4),)),
    "attributes": (_np_attributes, lambda: (torch.randn(3, 4),)),
    "mean_sum": (_mean_sum, lambda: (torch.randn(3, 4),)),
    "return_T": (lambda x: x.numpy().T, lambda: (torch.randn(3, 4),)),
    "return_many": (lambda x: (x.numpy().T, x.numpy().imag, x.numpy().real),
                    lambda: (torch.randn(3, 4),)),
    "copy": (lambda x: x.numpy().copy(), lambda: (torch.randn(3, 4),)),
    "transpose": (lambda x: x.numpy().transpose(0, 1), lambda: (torch.randn(3, 4),)),
    "reshape": (lambda x: x.numpy().reshape([1, x.numpy().size]), lambda: (torch.randn(3, 4),)),
    "scalars": (_methods_returning_scalar, lambda: (torch.randn(3),)),
    "operators": (lambda x: (x.numpy() + x.numpy(), x.numpy() - x.numpy(), -x.numpy(),
                             x.numpy() > 0), lambda: (torch.randn(3, 4),)),
    "dtype_argument": (_dtype_argument, lambda: (torch.randn(3),)),
    "dtype_call": (_dtype_call, lambda: (torch.randn(3),)),
    "linalg": (lambda x: np.linalg.norm(x.numpy(), axis=0), lambda: (torch.randn(3, 4),)),
    "fft": (lambda x: np.fft.fftshift(x.numpy()), lambda: (torch.randn(3, 4),)),
    "finfo": (_finfo, lambda: (torch.randn(3),)),
    "int_dtype_rules": (_dtype_rules, lambda: (torch.arange(6).reshape(2, 3),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_numpy_case_matches_eager_and_torch_graph_count(fresh_ferrodyn, name):
    fn, make = CASES[name]
    fd, tc = run_both(fn, *make())
    assert fd == tc == 1


def test_scalar_results_are_numpy_scalars_not_0d_arrays(fresh_ferrodyn):
    # eager numpy returns np.float32 scalars from full reductions; torch.compile returns 0-d
    # arrays there; ferrodyn returns what eager returns
    def fn(x):
        a = x.numpy()
        return np.sum(a), a.max(axis=0), np.asarray(np.sum(a)), a[0], a[0:1]
    got = ferrodyn.compile(fn, backend=CountingBackend())(torch.randn(3))
    assert [type(v) for v in got] == [np.float32, np.float32, np.ndarray, np.float32, np.ndarray]
    run_both(fn, torch.randn(3), torch_too=False)


def test_tensor_numpy_shares_memory_with_the_tensor(fresh_ferrodyn):
    def write_through(x):
        a = x.numpy()
        a[0] = 5.0
        a += 1
        return x * 2

    fd, tc = run_both(write_through, torch.zeros(3))
    assert fd == tc == 1
    x = torch.zeros(3)
    out = ferrodyn.compile(lambda t: t.numpy(), backend=CountingBackend())(x)
    assert type(out) is np.ndarray and np.shares_memory(out, x.numpy())
    x[1] = 7.0
    assert out[1] == 7.0


def test_numpy_scalar_is_immutable_under_inplace_operators(fresh_ferrodyn):
    def fn(x):
        a = x.numpy()
        s = a[0]
        s += 1  # rebinds s: `a` is unchanged in numpy (a 0-d view in torch._numpy)
        return s, x + 0
    fd, tc = run_both(fn, torch.ones(3))
    assert fd == 1


@pytest.mark.parametrize("arr,index,value", [
    (np.zeros(4), Ellipsis, np.ones(4)),
    (np.array([[1, 1], [2, 2]]), (0, Ellipsis), np.zeros(2)),
    (np.array([[1, 1], [2, 2]]), (Ellipsis, 1), np.array([3, 3])),
])
def test_ndarray_input_item_assignment(fresh_ferrodyn, arr, index, value):
    def fn(a, ind, val):
        a[ind] = val
        return a
    fd, tc = run_both(fn, arr, index, value)
    assert fd == tc == 1
    a = arr.copy()
    assert ferrodyn.compile(fn, backend=CountingBackend())(a, index, value) is a  # the input itself


def test_ndarray_inputs_recompile_on_dtype_and_shape(fresh_ferrodyn):
    def fn(a):
        return np.sin(a) + a.sum()
    backend = CountingBackend()
    cf = ferrodyn.compile(fn, backend=backend)
    inputs = [np.arange(4.0), np.arange(4.0) + 1, np.arange(4, dtype=np.float32),
              np.arange(5.0), np.arange(4.0)[::2].copy(), np.arange(8.0)[::2]]
    for a in inputs:
        _same(fn(a.copy()), cf(a))
    # float64[4] twice (one graph), float32[4], float64[5], float64[2], strided float64[4]
    assert backend.count == 5


def test_read_only_input_refuses_writes_as_eager_raises(fresh_ferrodyn):
    def fn(a):
        b = a * 2
        a[0] = 1.0
        return b
    a = np.zeros(3)
    a.flags.writeable = False
    with pytest.raises(ValueError):
        fn(a)
    with pytest.raises(ValueError):
        ferrodyn.compile(fn, backend=CountingBackend())(a)


def test_view_mismatch_with_torch_numpy_falls_back_exactly(fresh_ferrodyn):
    # numpy's a[::-1] is a view, torch._numpy's a copy (torch has no negative strides): a
    # write through it must reach `a`
    def fn(a):
        b = a[::-1]
        b[0] = 7.0
        return a
    a = np.zeros(3)
    got = ferrodyn.compile(fn, backend=CountingBackend())(a)
    assert got is a and a[2] == 7.0


def test_layout_follows_numpy(fresh_ferrodyn):
    # numpy's copy() is C-contiguous; torch's clone of a transpose keeps its strides
    def fn(x):
        b = x.numpy().T.copy()
        return b, b.strides
    fd, _ = run_both(fn, torch.randn(3, 4), torch_too=False)
    assert fd == 1


def test_numpy_scalars_as_inputs_and_constants(fresh_ferrodyn):
    def fn(x, a, b):
        return x + (a % b)

    def fn2(x, n):
        return np.issubdtype(type(n), np.integer) + x
    fd, tc = run_both(fn, torch.ones(10), 4096, np.int64(8))
    assert fd == tc == 1
    fd, tc = run_both(fn2, torch.ones(10), 4096)
    assert fd == tc == 1


def test_numpy_scalar_types_follow_nep50_promotion(fresh_ferrodyn):
    def fn(x):
        a = x.numpy()
        return a + np.float64(1.0), a + 1.0, np.float32(2) * 3, a * np.int64(2)
    run_both(fn, torch.ones(3), torch_too=False)


def test_np_random_is_not_traced(fresh_ferrodyn):
    # numpy's global random stream is advanced exactly as eager advances it
    def fn(x):
        r = np.random.rand(3)
        return x + torch.from_numpy(r)
    np.random.seed(0)
    expected = fn(torch.ones(3))
    after_eager = np.random.rand()
    np.random.seed(0)
    got = ferrodyn.compile(fn, backend=CountingBackend())(torch.ones(3))
    torch.testing.assert_close(expected, got)
    assert np.random.rand() == after_eager

    def fn2():
        x = np.random.randn(2, 2)
        return x - x
    fd, tc = run_both(fn2)
    assert fd == tc == 1


def test_tensor_numpy_refused_where_eager_raises(fresh_ferrodyn):
    def fn(x):
        return x.numpy() + 1
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        ferrodyn.compile(fn, backend=CountingBackend())(x)


def test_mixing_tensor_and_ndarray_operands_is_refused(fresh_ferrodyn):
    def fn(x):
        return x + x.numpy()
    expected = fn(torch.ones(2))
    got = ferrodyn.compile(fn, backend=CountingBackend())(torch.ones(2))
    _same(expected, got)


def test_numpy_scalar_from_indexing_is_a_copy_not_a_view(fresh_ferrodyn):
    # `a[0]` is an immutable numpy scalar; torch._numpy's 0-d result is a view of `a`: a later
    # write to `a` must not change it
    def fn(x):
        a = x.numpy()
        s0, s1 = a[0], a.max(axis=0)
        a[0] = -100.0
        a[1] = 100.0
        return s0 + 0, s1
    fd, tc = run_both(fn, torch.tensor([3.0, 1.0]))
    assert fd == tc == 1


def test_numpy_functions_on_tensors_follow_eager(fresh_ferrodyn):
    # np.transpose(tensor) calls the tensor's own method and returns a tensor in eager;
    # np.asarray(tensor) is an ndarray over the tensor's memory
    def to_tensor(x):
        return np.transpose(x)

    def as_array(x):
        return np.asarray(x), np.ones_like(x, dtype=np.float64)
    run_both(to_tensor, torch.randn(2, 3), torch_too=False)
    fd, tc = run_both(as_array, torch.randn(2, 3))
    assert fd == tc == 1
    x = torch.zeros(3)
    out, _ = ferrodyn.compile(as_array, backend=CountingBackend())(x)
    assert np.shares_memory(out, x.numpy())


def test_numpy_scalar_inputs_guarded_by_type_and_value(fresh_ferrodyn):
    def fn(x, a, b):
        return x + (a % b)
    backend = CountingBackend()
    cf = ferrodyn.compile(fn, backend=backend)
    values = [np.int64(8), np.int64(8), np.int64(3), np.int32(8), np.float64(8.0),
              np.float64(8.0), np.bool_(True), np.float16(3), np.float16(3)]
    for v in values:
        expected = fn(torch.ones(2), 4096, v)
        got = cf(torch.ones(2), 4096, v)
        assert type(got) is type(expected) and torch.equal(got, expected), v
    # new objects of one type and value hit; float16 (no buffer read-back) is guarded by
    # identity: each new object recompiles
    assert backend.count == 7


@pytest.mark.parametrize("make", [
    lambda x: x.numpy()[None, ::2],          # a view: numpy's size-1 stride differs from torch's
    lambda x: x.numpy().T.copy(),            # numpy copies to C order, torch keeps the layout
    lambda x: np.copy(x.numpy().T),          # np.copy keeps the layout ('K')
    lambda x: x.numpy().T[None] * 2,
    lambda x: np.expand_dims(x.numpy(), 0),
], ids=["unit_dim_view", "copy_C", "np_copy_K", "op_on_view", "expand_dims"])
def test_returned_arrays_have_numpy_strides_and_sharing(fresh_ferrodyn, make):
    x = torch.randn(3, 4)
    expected, got = make(x), ferrodyn.compile(make, backend=CountingBackend())(x)
    _same(expected, got)
    assert np.shares_memory(expected, x.numpy()) == np.shares_memory(got, x.numpy())


@pytest.mark.parametrize("write", [
    lambda a: a.sort(),
    lambda a: a.fill(3.0),
    lambda a: np.copyto(a, 5.0),
    lambda a: a.__iadd__(1.0),
], ids=["sort", "fill", "copyto", "iadd"])
def test_numpy_in_place_methods_write_through_to_the_tensor(fresh_ferrodyn, write):
    def fn(x):
        write(x.numpy())
        return x + 1
    fd, _ = run_both(fn, torch.randn(4), torch_too=False)
    assert fd == 1


def test_ndarrays_live_across_a_graph_break(fresh_ferrodyn):
    def fn(x):
        a = x.numpy()
        b = a * 2
        s = a.sum()
        torch._dynamo.graph_break()
        a[0] = 7.0       # still x's memory after the break
        b[1] = 100.0
        return x + 1, b, s, a is a
    fd, tc = run_both(fn, torch.ones(3))
    # after the break `a` (x's memory) is written and x read: that graph is refused (see
    # test_overlapping_array_inputs_of_a_graph_writing_to_an_input), the rest runs eagerly
    assert fd == 1 and tc == 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_overlapping_array_inputs_of_a_graph_writing_to_an_input(backend):
    """A graph writing to an ndarray input beside another array input is refused: their memory
    may overlap (a view of the same array, a tensor made by torch.from_numpy) with no storage
    for the aliasing guard to compare, and aot_eager computed from the stale input."""
    def f(a, b):
        a += 1
        return b * 2

    def g(a, t):
        a += 1
        return t * 2

    c, cg = ferrodyn.compile(f, backend=backend), ferrodyn.compile(g, backend=backend)
    c(np.arange(6.0), np.arange(5.0))  # first traced with disjoint arrays
    cg(np.arange(4.0), torch.arange(4.0))
    base, ref = np.arange(6.0), np.arange(6.0)
    got, want = c(base, base[1:]), f(ref, ref[1:])
    assert np.array_equal(got, want) and np.array_equal(base, ref)
    base, ref = np.arange(4.0), np.arange(4.0)
    got, want = cg(base, torch.from_numpy(base)), g(ref, torch.from_numpy(ref))
    assert torch.equal(got, want) and np.array_equal(base, ref)

    def h(x):  # an ndarray of x's memory lives across a break, then is written and x read
        a = x.numpy()
        torch._dynamo.graph_break()
        a[0] = 7.0
        return x + 1

    ch = ferrodyn.compile(h, backend=backend)
    for _ in range(2):
        assert torch.equal(ch(torch.ones(3)), h(torch.ones(3)))

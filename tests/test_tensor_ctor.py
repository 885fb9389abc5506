"""`torch.tensor(data)` of traced values and `torch._shape_as_tensor(x)`
(variables/tensor_ctor.py), and `out=` calls that resize their out tensor (tensor.record_op).
Found by PyTorch's test/dynamo tests (test_tensor_ctor_and_types-like `torch.tensor([x])`,
test_shape_as_tensor, test_out_variants_resizing) run through ferrodyn: the first two made the
frame eager ("data is not allocated" on fake tensors); the third captured out= resizes of graph
inputs, which TorchDynamo refuses because aot/inductor functionalization cannot replay them.

Each case compares results (type, dtype, values) with eager, and graph counts with
torch.compile's; refused conversions raise eager's error."""

import copy

import pytest
import torch

import ferrodyn
from compiled_vs_eager import same
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _compare(fn, *args):
    torch._dynamo.reset()
    a_eager, a_fd, a_tc = (copy.deepcopy(args) for _ in range(3))
    try:
        want, want_exc = fn(*a_eager), None
    except Exception as e:
        want, want_exc = None, type(e)
    fd, tc = CountingBackend(), CountingBackend()
    try:
        got, got_exc = ferrodyn.compile(fn, backend=fd)(*a_fd), None
    except Exception as e:
        got, got_exc = None, type(e)
    try:
        torch.compile(fn, backend=tc)(*a_tc)
    except Exception:
        pass
    torch._dynamo.reset()
    assert got_exc is want_exc, (got_exc, want_exc)
    assert same(want, got), (want, got)
    assert same(a_eager, a_fd), "mutated arguments differ"
    return fd.count, tc.count


def int_of_tensor(x):
    return torch.tensor([x], dtype=torch.int64)


def mixed_list(x, y):
    return torch.tensor([[x, 2.5], [y.sum(), 1.0]]) * 2


def inferred_dtype(x):
    return torch.tensor((x, x + 1))


def nested_float(x):
    return torch.tensor([x * 2, x], dtype=torch.float64)


def symbolic_size(x):
    return torch.tensor([x.shape[0], 3]) + 1


CAPTURED = {
    "int_of_int_tensor": (int_of_tensor, torch.tensor(20)),
    "mixed_list": (mixed_list, torch.tensor(1.5), torch.arange(4.0)),
    "inferred_dtype_int": (inferred_dtype, torch.tensor(7)),
    "inferred_dtype_f64": (inferred_dtype, torch.tensor(0.1, dtype=torch.float64)),
    "float32_into_float64": (nested_float, torch.tensor(0.1)),
    "int_into_float64": (nested_float, torch.tensor(3)),
}


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_tensor_of_traced_values(name):
    fn, *args = CAPTURED[name]
    fd, tc = _compare(fn, *args)
    assert fd == 1 and fd <= max(tc, 1), (fd, tc)


def test_tensor_of_symbolic_size():
    f = ferrodyn.compile(symbolic_size, backend=(b := CountingBackend()))
    for n in (4, 5, 6):
        x = torch.ones(n)
        assert same(f(x), symbolic_size(x))
    assert b.count == 2  # static first, then one dynamic graph for every size


REFUSED = {
    # eager: a float Python number into an integer dtype is a TypeError; a cast would truncate
    "float_into_int": (int_of_tensor, torch.tensor(2.5)),
    # eager: 300 does not fit int8 (RuntimeError); a cast would wrap
    "overflow_into_int8": (lambda x: torch.tensor([x], dtype=torch.int8), torch.tensor(300)),
    "complex_into_float": (lambda x: torch.tensor([x], dtype=torch.float32),
                           torch.tensor(1 + 2j)),
    "constant_overflow": (lambda x: torch.tensor([x, 300], dtype=torch.int8),
                          torch.tensor(3, dtype=torch.int8)),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_tensor_of_traced_values_refused_like_eager(name):
    fn, *args = REFUSED[name]
    fd, tc = _compare(fn, *args)
    assert fd == 0, fd


def shape_plus_one(x):
    return 1 + torch._shape_as_tensor(x)[0]


def test_shape_as_tensor_is_an_int64_tensor():
    b = CountingBackend()
    f = ferrodyn.compile(shape_plus_one, backend=b)
    for shape in ((6,), (7,), (7,), (9,)):
        x = torch.ones(*shape)
        want, got = shape_plus_one(x), f(x)
        assert type(got) is torch.Tensor and same(want, got)
    assert b.count == 2  # (6,), then (7,) marks the size dynamic: one graph for the rest


def test_shape_as_tensor_whole():
    fd, _ = _compare(lambda x: torch._shape_as_tensor(x) * 2, torch.ones(3, 5, 2))
    assert fd == 1


def cosh_out(x, y):
    return torch.cosh(x, out=y) + 1


def mv_out(a, b, c):
    torch.mv(b, c, out=a)
    return a


def test_out_variant_resizing_its_out_tensor_breaks_like_torch():
    fd, tc = _compare(cosh_out, torch.arange(6.0).reshape(2, 3), torch.rand(4))
    assert fd <= tc, (fd, tc)
    fd, tc = _compare(mv_out, torch.empty(0), torch.ones(3, 3), torch.ones(3))
    assert fd <= max(tc, 0) and fd == 0, (fd, tc)


def test_out_variant_same_shape_is_captured():
    def f(x, y):
        torch.cosh(x, out=y)
        return y * 2
    fd, tc = _compare(f, torch.arange(6.0), torch.rand(6))
    assert fd == 1 and tc <= fd


def test_out_variant_returns_its_out_tensor():
    def f(x, y):
        r = torch.sin(x, out=y)
        return r is y, r
    x, y = torch.arange(4.0), torch.zeros(4)
    got = ferrodyn.compile(f, backend=CountingBackend())(x, y)
    assert got[0] is True and got[1] is y and same(y, torch.sin(x))

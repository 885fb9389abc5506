"""tensor_metadata() (rust/tensor/mod.rs) against the Python API, on hypothesis-generated
shapes and strides and on views, dtypes, devices and autograd states."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ferrodyn import _C

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32,
          torch.int64, torch.bool, torch.complex64, torch.uint8]


def expected(t):
    return {
        "sizes": tuple(t.size()),
        "strides": tuple(t.stride()),
        "dtype": t.dtype,
        "device_type": t.device.type,
        "device_index": -1 if t.device.index is None else t.device.index,
        "requires_grad": t.requires_grad,
        "dispatch_keys": torch._C._dispatch_keys(t).raw_repr(),
    }


def check(t, fast=None):
    md = _C.tensor_metadata(t)
    got_fast = md.pop("fast")
    assert md == expected(t)
    if fast is not None:
        assert got_fast is fast
    return got_fast


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None)
@given(shape=shapes, data=st.data())
def test_empty_strided_any_strides(shape, data):
    strides = data.draw(st.lists(st.integers(0, 50), min_size=len(shape), max_size=len(shape)))
    dtype = data.draw(st.sampled_from(DTYPES))
    device = data.draw(st.sampled_from(["cpu", "meta"]))
    t = torch.empty_strided(shape, strides, dtype=dtype, device=device)
    check(t, fast=True)  # a fresh leaf without autograd metadata reads directly


@settings(max_examples=100, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=7), data=st.data())
def test_views(shape, data):
    t = torch.randn(shape)
    perm = data.draw(st.permutations(range(len(shape))))
    v = t.permute(perm)
    d = data.draw(st.integers(0, len(shape) - 1))
    step = data.draw(st.integers(1, 3))
    v = v.narrow(d, 0, max(1, v.size(d) // 2))[..., ::step] if v.dim() else v
    requires_grad = data.draw(st.booleans())
    if requires_grad:
        v = v.detach().requires_grad_()
    check(v, fast=True)
    check(v.unsqueeze(0).expand(3, *v.shape), fast=True)


@pytest.mark.parametrize("make", [
    lambda: torch.randn(3, requires_grad=True),
    lambda: torch.randn(3, requires_grad=True) * 2,
    lambda: torch.nn.Parameter(torch.randn(2, 2)),
    lambda: torch.randn(2, 2, requires_grad=True).requires_grad_(False),
    lambda: torch.tensor(5),
])
def test_autograd_states_read_directly(make):
    check(make(), fast=True)


def test_views_and_inference_tensors_read_directly():
    base = torch.randn(4, 4, requires_grad=True)
    with torch.no_grad():
        v = base[1:]
    check(v, fast=True)  # requires_grad comes from the base (read through the view's metadata)
    check(v.detach(), fast=True)
    check(base[1:], fast=True)  # grad_fn set
    with torch.inference_mode():
        check(torch.randn(2, 3), fast=True)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="needs a torch.Tensor"):
        _C.tensor_metadata([1])

"""Differential test of tensor_match (rust/tensor/spec.rs): for hypothesis-generated pairs of
tensors the guard's verdict equals an oracle written with the Python API, and explain() names
a property that really differs."""

import torch
from hypothesis import given, settings, strategies as st

from ferrodyn import _C


class Sub(torch.Tensor):
    pass


def oracle(example, t, dynamic, check_strides):
    if type(t) is not type(example):
        return False
    if (t.dtype, t.device, t.requires_grad, t.dim()) != (example.dtype, example.device, example.requires_grad,
                                                         example.dim()):
        return False
    if torch._C._dispatch_keys(t).raw_repr() != torch._C._dispatch_keys(example).raw_repr():
        return False
    for d in range(t.dim()):
        if d in dynamic:
            continue
        if t.size(d) != example.size(d) or (check_strides and t.stride(d) != example.stride(d)):
            return False
    return True


@st.composite
def tensors(draw):
    ndim = draw(st.integers(0, 7))
    shape = draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bfloat16]))
    t = torch.zeros(shape, dtype=dtype, device=draw(st.sampled_from(["cpu", "meta"])))
    if ndim >= 2 and draw(st.booleans()):
        t = t.transpose(0, ndim - 1)
    if ndim >= 1 and draw(st.booleans()):
        t = t[..., :1]
    if dtype.is_floating_point and draw(st.booleans()):
        t = t.detach().requires_grad_()
        if draw(st.booleans()):
            t = t * 1  # non-leaf
        elif ndim and draw(st.booleans()):
            t = t[0]  # view of a leaf that requires grad
    if draw(st.booleans()) and not t.requires_grad:
        t = t.as_subclass(Sub)
    return t


@settings(max_examples=300, deadline=None)
@given(example=tensors(), other=tensors(), data=st.data())
def test_verdict_matches_the_python_oracle(example, other, data):
    dynamic = data.draw(st.sets(st.integers(0, max(example.dim() - 1, 0)), max_size=2)) if example.dim() else set()
    check_strides = data.draw(st.booleans())
    b = _C.GuardBuilder()
    b.tensor_match(b.local(0, "x"), example, dynamic_dims=sorted(dynamic), check_strides=check_strides)
    tree = b.build()
    assert tree.check((example,))
    for t in (other, example.detach() if example.requires_grad else example):
        want = oracle(example, t, dynamic, check_strides)
        assert tree.check((t,)) is want
        assert tree.check({"x": t}) is want
        why = tree.explain((t,))
        assert (why is None) is want
        if why is not None:
            assert why.startswith(("type(L['x']) is", "L['x'].dtype ==", "L['x'].device ==", "L['x'].requires_grad ==",
                                   "L['x'].dim() ==", "L['x'].size()[", "L['x'].stride()[", "L['x'] dispatch keys"))

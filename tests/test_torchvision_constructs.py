"""Constructs found in torchvision model code (detection, segmentation, video, optical flow),
each reproduced in small: compiled (ferrodyn) vs eager on the same inputs, and ferrodyn's graph
count compared with torch.compile's in the same test. The whole models are swept by a private
probe; these tests pin each cause it found.
"""

import types

import pytest
import torch
import torch._dynamo

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _both(fn, *args):
    """(ferrodyn result, torch.compile result, ferrodyn graphs, torch graphs, break reasons)."""
    torch._dynamo.reset()
    tb = CountingBackend()
    tout = torch.compile(fn, backend=tb)(*args)
    torch._dynamo.reset()
    reasons = ferrodyn.explain(fn)(*args).break_reasons
    ferrodyn.reset()
    fb = CountingBackend()
    out = ferrodyn.compile(fn, backend=fb)(*args)
    return out, tout, fb.count, tb.count, reasons


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, atol=1e-6)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _helper(x):
    return x + 1


def test_function_class_attribute():
    # torchvision.utils._log_api_usage_once: `obj.__class__.__name__`, then isinstance(obj, FunctionType)
    def fn(x):
        name = _helper.__class__.__name__
        if isinstance(_helper, types.FunctionType):
            name = _helper.__name__
        return _helper(x) * len(name), _helper.__class__

    x = torch.randn(3)
    out, tout, fc, tc, reasons = _both(fn, x)
    ref = fn(x)
    assert _same(out, ref) and _same(tout, ref)
    assert out[1] is types.FunctionType
    assert reasons == []
    assert fc == tc == 1


def test_multihead_attention_eval_no_grad_one_graph():
    # torchvision's VisionTransformer EncoderBlock: nn.MultiheadAttention asks the dispatch mode
    # stack (activation._is_make_fx_tracing) before its fast path
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()

    def fn(x):
        return mha(x, x, x, need_weights=False)[0].relu()

    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        ref = fn(x)
        out, tout, fc, tc, reasons = _both(fn, x)
    assert _same(out, ref)
    assert torch.allclose(tout, ref, atol=1e-5)
    assert reasons == []
    assert fc == tc == 1


def test_dispatch_mode_stack_is_a_fresh_empty_list():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    def fn(x):
        stack = _get_current_dispatch_mode_stack()
        stack.append(1)  # a fresh list: appending must not leak into a later call
        return x * len(_get_current_dispatch_mode_stack()) + len(stack)

    x = torch.randn(3)
    out, tout, fc, tc, reasons = _both(fn, x)
    ref = fn(x)
    assert _same(out, ref) and _same(tout, ref)
    assert reasons == []
    assert fc == tc == 1

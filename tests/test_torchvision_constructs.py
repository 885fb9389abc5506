"""Constructs found in torchvision model code (detection, segmentation, video, optical flow),
each reproduced in small: compiled (ferrodyn) vs eager on the same inputs, and ferrodyn's graph
count compared with torch.compile's in the same test. The whole models are swept by a private
probe; these tests pin each cause it found.
"""

import bisect
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


# -- a graph break inside a `for` loop over a live list (detection postprocess loops:
#    `for boxes, scores, shape in zip(boxes_t, scores_t, image_shapes)`, transforms Compose)

def _nonzero_rows(x):
    return x[x > 0]  # data-dependent shape: a graph break


def _zip_loop(xs, sizes):
    out = []
    for x, s in zip(xs, sizes):  # `sizes` is an argument: a live list at the break
        y = _nonzero_rows(x * s)
        out.append(y.sum() + s)
    return out


def _enumerate_loop(x, sizes):
    for i, s in enumerate(sizes):
        x = _nonzero_rows(x * s) + i
    return x, sizes


def _mutated_by_the_break(x, items):
    for v in items:
        x = x * 2 + v
        if len(items) < 4:
            bisect.insort(items, 10 + len(items))  # not traced: the break, run by the entry
        x = x.sin()
    return x, items


def _run_loop(fn, make):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    reasons = ferrodyn.explain(fn)(*make()).break_reasons
    ferrodyn.reset()
    cf = ferrodyn.compile(fn, backend=ours)
    for _ in range(2):
        args, ref_args = make(), make()
        out, ref = cf(*args), fn(*ref_args)
        assert _same(out, ref) and _same(args, ref_args)
    torch.compile(fn, backend=theirs)(*make())
    torch._dynamo.reset()
    return ours.count, theirs.count, reasons


def _eager_frames(reasons):
    return [r for r in reasons if ": graph break: " not in r]


def test_break_in_zip_loop_over_an_argument_list():
    torch.manual_seed(0)
    xs = torch.randn(2, 6)
    ours, theirs, reasons = _run_loop(_zip_loop, lambda: (xs.clone(), [2, 3]))
    assert not _eager_frames(reasons)  # was: the resume function ran eagerly (a zip object)
    assert ours == 3  # root; the loop body's resume entry for item 1; for the loop end
    assert theirs == 1  # torch.compile runs the frame with the loop eagerly


def test_break_in_enumerate_loop_over_an_argument_list():
    torch.manual_seed(0)
    x = torch.randn(8) + 2
    ours, theirs, reasons = _run_loop(_enumerate_loop, lambda: (x.clone(), [1, 2, 3]))
    assert not _eager_frames(reasons)
    # root, then one resume entry per position (LiveRest guards the list index and the
    # enumerate count, as torch.compile's iterator-length guard does)
    assert ours == 4 and theirs == 2


def test_break_in_loop_over_a_list_the_break_mutates():
    # the live iterator sees the items the break appended
    ours, theirs, reasons = _run_loop(_mutated_by_the_break, lambda: (torch.ones(3), [1, 2]))
    assert not _eager_frames(reasons)
    assert ours == 3  # root, the body's resume entry, the entry after the list grew
    assert theirs == 0  # torch.compile runs the frame eagerly


class _Partition(torch.nn.Module):
    # torchvision maxvit PartitionAttentionLayer: an assert message formatted from a tuple
    def __init__(self):
        super().__init__()
        self.grid_size, self.p = (4, 6), 2

    def forward(self, x):
        torch._assert(self.grid_size[0] % self.p == 0,
                      "grid size {} and partition size {}".format(self.grid_size, self.p))
        return x * len("{}".format(self.grid_size))


def test_str_format_of_a_tuple_attribute():
    m = _Partition()
    x = torch.randn(3)
    out, tout, fc, tc, reasons = _both(m, x)
    assert _same(out, m(x)) and _same(tout, m(x))
    assert reasons == []
    assert fc == tc == 1
    cf = ferrodyn.compile(m, backend=CountingBackend())
    cf(x)
    m.grid_size = (40, 6)  # the formatted string changes: the items are guarded
    assert _same(cf(x), m(x))


# -- a new object live twice at a break (GeneralizedRCNN.forward: `images` = ImageList(...)
#    is a local and an argument of `self.rpn(images, features)` when the rpn breaks)

class _ImageList:
    def __init__(self, tensors, sizes):
        self.tensors, self.sizes = tensors, sizes


def _show(images):
    print("images")  # noqa: T201  (a graph break)
    images.sizes.append(9)
    return images.tensors + len(images.sizes)


def _object_live_twice(x):
    images = _ImageList(x * 2, [3, 4])
    y = _show(images)
    for s in images.sizes:  # the list appended to after the break, through the object
        y = y + s
    return y + images.tensors, images, images


def test_new_object_live_twice_across_a_break(capsys):
    x = torch.randn(3)
    ref = _object_live_twice(x)
    out, tout, fc, tc, reasons = _both(_object_live_twice, x)
    assert not _eager_frames(reasons)  # was: the frame ran eagerly ("reachable twice")
    assert out[1] is out[2]  # one object, however often it is reached
    assert type(out[1]) is _ImageList and out[1].sizes == ref[1].sizes == [3, 4, 9]
    assert _same(out[0], ref[0]) and _same(out[1].tensors, ref[1].tensors)
    assert fc == tc == 2


# -- `xs.append(call())` where the call breaks (RetinaNet.compute_loss:
#    `matched_idxs.append(self.proposal_matcher(...))`): the bound method is on the stack

def _where(x):
    return torch.where(x > 0)[0]  # data-dependent shape: a graph break


def _append_new_list(xs):
    out = []
    for x in xs:
        out.append(_where(x * 2))
    return out


def _append_argument_list(x, out):
    out.append(_where(x))
    out.append(x + 1)
    return out


def test_list_append_of_a_breaking_call_new_list():
    xs = [torch.randn(5), torch.randn(6)]
    out, tout, fc, tc, reasons = _both(_append_new_list, xs)
    assert _same(out, _append_new_list(xs))
    assert not _eager_frames(reasons)  # was: refused, "a live bound method append"
    assert fc == tc == 2


def test_list_append_of_a_breaking_call_argument_list():
    x = torch.randn(5)
    ref_list, out_list = [1], [1]
    ref = _append_argument_list(x, ref_list)
    torch._dynamo.reset()
    tb = CountingBackend()
    torch.compile(_append_argument_list, backend=tb)(x, [1])
    reasons = ferrodyn.explain(_append_argument_list)(x, [1]).break_reasons
    ferrodyn.reset()
    fb = CountingBackend()
    out = ferrodyn.compile(_append_argument_list, backend=fb)(x, out_list)
    assert out is out_list and _same(out, ref)  # appended to the caller's list, in order
    assert not _eager_frames(reasons)
    assert fb.count == tb.count == 2


def _appended_after_the_break(x, items):
    for v in items:
        x = x * 2 + v
        if v == 1:
            torch._dynamo.graph_break()
        if len(items) < 3:
            items.append(len(items) + 10)  # through the local: the LiveRest's list is this one
    return x, items


def _zip_appended_after_the_break(x, items):
    for v, w in zip(items, items):
        x = x * 2 + v - w
        if v == 1:
            torch._dynamo.graph_break()
        if len(items) < 3:
            items.append(len(items) + 10)
    return x, items


@pytest.mark.parametrize("fn", [_appended_after_the_break, _zip_appended_after_the_break])
def test_break_in_loop_over_a_list_the_resumed_trace_appends_to(fn):
    ours, theirs, reasons = _run_loop(fn, lambda: (torch.ones(2), [1]))
    assert not _eager_frames(reasons)
    assert ours == 2 and theirs == 0  # torch.compile runs the frame eagerly

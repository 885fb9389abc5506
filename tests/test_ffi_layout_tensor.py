"""The tensor layout that rust/tensor/calibrate.rs located (and rust/ffi/tensor.rs reads),
cross-checked against the torch headers it is described by and against raw memory read
independently here with ctypes."""

import ctypes

import pytest
import torch

from ferrodyn import _C

WORD = ctypes.sizeof(ctypes.c_void_p)


@pytest.fixture(scope="module")
def layout():
    lay = _C._tensor_layout()
    assert lay is not None, _C._tensor_fast_path_failure()
    return lay


def words(addr, n):
    return list((ctypes.c_int64 * n).from_address(addr))


def test_thpvariable_cdata_follows_pyobject_head(layout):
    # torch/csrc/autograd/python_variable.h: struct THPVariable { PyObject_HEAD; at::Tensor cdata; ... }
    assert layout["cdata"] == 2 * WORD
    t = torch.randn(3)
    assert ctypes.c_void_p.from_address(id(t) + layout["cdata"]).value == t._cdata


def test_tensorimpl_field_order_matches_the_header(layout):
    # c10/core/TensorImpl.h: ... autograd_meta_, extra_meta_, version_counter_, pyobj_slot_,
    # sizes_and_strides_ (88 bytes), storage_offset_, numel_, data_type_ (2), device_opt_ (3),
    # bitfields, key_set_ (8, aligned).
    assert layout["autograd_meta"] + 4 * WORD == layout["sizes_strides"]
    assert layout["dtype"] == layout["sizes_strides"] + 88 + 2 * 8
    assert layout["device"] == layout["dtype"] + 2
    assert layout["flags"] == layout["device"] + 3
    assert layout["keys"] == (layout["flags"] + 7) // 8 * 8
    assert layout["policy_mask"] != 0 and layout["policy_mask"] < 1 << (8 * layout["flags_len"])


def test_sizes_and_strides_inline_and_out_of_line(layout):
    # c10/core/impl/SizesAndStrides.h: size_t size_; union { int64_t* outOfLine; int64_t inline[10]; }
    for t in (torch.randn(2, 3, 4), torch.randn(5, 6).t(), torch.randn(2, 1, 2, 3, 1, 2, 2)):
        base = t._cdata + layout["sizes_strides"]
        n = words(base, 1)[0]
        assert n == t.dim()
        if n <= 5:
            sizes, strides = words(base + 8, n), words(base + 8 + 5 * 8, n)
        else:
            arr = ctypes.c_void_p.from_address(base + 8).value
            sizes, strides = words(arr, n), words(arr + 8 * n, n)
        assert tuple(sizes) == t.size() and tuple(strides) == t.stride()
        md = _C.tensor_metadata(t)
        assert md["fast"] and md["sizes"] == t.size() and md["strides"] == t.stride()


def test_keys_and_autograd_meta_raw(layout):
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    for t in (x, y, torch.randn(2)):
        assert words(t._cdata + layout["keys"], 1)[0] == torch._C._dispatch_keys(t).raw_repr()
    assert words(torch.randn(2)._cdata + layout["autograd_meta"], 1)[0] == 0
    am_x = ctypes.c_void_p.from_address(x._cdata + layout["autograd_meta"]).value
    am_y = ctypes.c_void_p.from_address(y._cdata + layout["autograd_meta"]).value
    assert ctypes.c_uint8.from_address(am_x + layout["am_requires_grad"]).value == 1
    assert ctypes.c_uint8.from_address(am_y + layout["am_requires_grad"]).value == 0
    assert ctypes.c_void_p.from_address(am_x + layout["am_grad_fn"]).value is None
    assert ctypes.c_void_p.from_address(am_y + layout["am_grad_fn"]).value is not None


def test_view_meta_base_and_flag(layout):
    # torch/csrc/autograd/variable.h: DifferentiableViewMeta : AutogradMeta { optional<ViewInfo>
    # backward_info_; ... }, ViewInfo { Variable base_; unique_ptr<ViewFunc>; std::function<...> }.
    assert layout["view_engaged"] == layout["view_base"] + 8 + 8 + 32
    base = torch.randn(4, 4)
    v = base[1:]
    am = ctypes.c_void_p.from_address(v._cdata + layout["autograd_meta"]).value
    assert ctypes.c_void_p.from_address(am + layout["view_base"]).value == base._cdata
    assert ctypes.c_uint8.from_address(am + layout["view_engaged"]).value == 1


# Fills the heap with freed float64 buffers whose 21st element alternates -1.0 / 1.0: a
# TensorImpl allocated on such a chunk has the sign byte of that element where its bitfield word
# ends, so the padding bit there (never written by TensorImpl's constructor) is set on some
# tensors and clear on others. Calibration used to compare one wrapper per policy with one
# policy-free wrapper and took such a padding bit for a policy bit whenever the two differed;
# verification then failed on the first sample with the bit set ("tensor N: policy disagrees").
POISON_HEAP = r"""
import torch
keep = []
for _ in range(200):
    junk = [torch.full((22,), -1.0 if i % 2 else 1.0, dtype=torch.float64) for i in range(64)]
    keep.append(junk[::3])
    del junk
"""

FIRST_USE_ON_A_POISONED_HEAP = POISON_HEAP + r"""
import json
from ferrodyn import _C
fast, failure, layout = _C.tensor_fast_path(), _C._tensor_fast_path_failure(), _C._tensor_layout()
print(json.dumps({"fast": fast, "failure": failure, "layout": layout}))
"""


def test_calibration_on_a_poisoned_heap_ignores_bitfield_padding(layout):
    import json
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FIRST_USE_ON_A_POISONED_HEAP], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["fast"] and got["failure"] is None, got["failure"]
    assert got["layout"] == layout  # the same offsets and policy mask as this (unpoisoned) process


def test_padding_garbage_in_the_flags_word_keeps_tensors_on_the_fast_path(layout):
    exec(POISON_HEAP, {"torch": torch})
    ts = [torch.zeros(3, 2) for _ in range(200)]
    f, n = layout["flags"], layout["flags_len"]
    words = {int.from_bytes(ctypes.string_at(t._cdata + f, n), "little") for t in ts}
    garbage = 0
    for w in words:
        garbage |= w ^ next(iter(words))
    # The precondition: identical plain tensors differ in the flags word (the padding bits) ...
    assert garbage != 0, [hex(w) for w in words]
    # ... and none of those bits is taken for a policy bit: every one is read directly.
    assert garbage & layout["policy_mask"] == 0
    for t in ts:
        md = _C.tensor_metadata(t)
        assert md.pop("fast") is True
        assert md["sizes"] == (3, 2) and md["strides"] == (2, 1) and md["dtype"] == torch.float32

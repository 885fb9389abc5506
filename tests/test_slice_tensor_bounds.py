"""Slices whose bounds are tensors (`x[t:]` with a 0-d tensor `t`, as in test_repros'
slicing_dynamic_shape). Before: a `slice(tensor, ...)` frame argument crashed guard compilation
(a storage-offset shape guard bound with dim None), and `x[y[0]:]` made the whole frame run
eagerly (BUILD_SLICE was not a resumable break). Now the slice is built eagerly at a graph
break (resume/stack_ops.py) and its storage-offset guard compiles (symbolic_shapes.py). Each
case compares results with eager over calls that move the bound, and graph counts with
torch.compile's."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _counts(fn, calls):
    fb = CountingBackend()
    ff = ferrodyn.compile(fn, backend=fb)
    for args in calls:
        got, ref = ff(*args), fn(*args)
        assert got.shape == ref.shape and torch.equal(got, ref)
    torch._dynamo.reset()
    tb = CountingBackend()
    tf = torch.compile(fn, backend=tb)
    for args in calls:
        tf(*args)
    torch._dynamo.reset()
    return fb.count, tb.count


def test_slice_with_tensor_bound_passed_in():
    def f(x, s):
        return x[s] * 2
    x = torch.randn(8)
    calls = [(x, slice(torch.tensor(2), None)), (x, slice(torch.tensor(3), None)),
             (x, slice(torch.tensor(3), torch.tensor(6)))]
    fd, tc = _counts(f, calls)
    # torch.compile runs these frames eagerly (0 graphs); ferrodyn captures the arithmetic
    assert tc == 0 and fd >= 1


def test_slice_bound_read_from_a_tensor_breaks_not_eager():
    def f(y):
        x = torch.ones(8)
        idx = y[0]
        return (x[idx:] + 3) * 5
    calls = [(torch.ones(10, dtype=torch.long),), (torch.tensor([4]),), (torch.tensor([2]),)]
    fd, tc = _counts(f, calls)
    # torch.compile: a break at the slice (2 graphs); ferrodyn also breaks there (no longer
    # the whole frame eager), and specialises the resumed graph on the bound's value
    assert tc == 2 and fd >= tc


def test_two_tensor_bounds_and_step():
    def f(y, x):
        return x[y[0]:y[1]:1] * 2
    calls = [(torch.tensor([1, 5]), torch.randn(8)), (torch.tensor([2, 3]), torch.randn(8))]
    fd, tc = _counts(f, calls)
    # torch.compile runs these frames eagerly (0 graphs); ferrodyn captures the arithmetic
    assert tc == 0 and fd >= 1

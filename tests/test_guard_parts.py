"""Constants that no single EQUALS leaf holds (torch.Size, range, torch.device) are guarded
through their parts: a call with an equal value hits, a changed item, bound or device index
recompiles; compiled == eager; graph counts against torch.compile's (same inputs)."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def f(x, shape, r, dev):
    return x.reshape(shape) * len(r) + r.start, torch.zeros(2, device=dev)


CALLS = [
    (torch.Size([2, 3]), range(1, 4), torch.device("cpu")),
    (torch.Size([2, 3]), range(1, 4), torch.device("cpu")),   # equal values: a cache hit
    (torch.Size([3, 2]), range(1, 4), torch.device("cpu")),   # an item of the Size changed
    (torch.Size([3, 2]), range(0, 4), torch.device("cpu")),   # a bound of the range changed
]


def test_size_range_device_arguments_are_guarded_by_their_parts():
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    compiled = ferrodyn.compile(f, backend=ours, fullgraph=True)
    by_torch = torch.compile(f, backend=theirs, dynamic=False)
    x = torch.arange(6.0)
    counts = []
    for args in CALLS:
        got, want = compiled(x, *args), f(x, *args)
        by_torch(x, *args)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        counts.append(ours.count)
    assert counts == [1, 1, 2, 3]
    assert ours.count <= theirs.count

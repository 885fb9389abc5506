"""Views whose storage offset changes between calls (an offset equal to the view's length, so
the ShapeEnv relates the two symbols): after the recompile that marks them dynamic, the shape
guard binds a symbol to the storage offset, which has no dim. Compiled vs eager on each call,
graph counts beside torch.compile's (the guard used to fail to compile: TypeError)."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def double(x):
    return x * 2


def test_view_with_changing_storage_offset():
    base = torch.arange(40.0)
    fd, tc = CountingBackend(), CountingBackend()
    ours, theirs = ferrodyn.compile(double, backend=fd), torch.compile(double, backend=tc)
    for k in (1, 3, 5, 7):
        v = base[k + 2:2 * k + 4]  # offset k + 2, length k + 2
        assert torch.equal(ours(v), double(v))
        assert torch.equal(theirs(v), double(v))
    torch._dynamo.reset()
    assert fd.count == tc.count == 2

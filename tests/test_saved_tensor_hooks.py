"""The user's `saved_tensors_hooks` see what eager autograd saves, also on the call that
compiles: tracing and backend compiles must not call pack hooks with fake tensors. Before the
fix, the compiling call packed every saved tensor twice, so non-reentrant activation
checkpointing raised `CheckpointError` on `.backward()` where eager ran.

Also: frames of code that `dataclasses`/`namedtuple` generate are never compile roots (torch's
own compile inside `torch.cond` ran them under ferrodyn's hook and filled their caches)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _packed_shapes(fn, *args):
    shapes = []

    def pack(t):
        shapes.append((tuple(t.shape), type(t).__name__))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, shapes


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_pack_hooks_see_eager_saves_on_the_compiling_call(backend):
    lin = torch.nn.Linear(4, 4)

    def blk(x):
        return torch.relu(lin(x)) * 2

    x = torch.randn(3, 4, requires_grad=True)
    ref, ref_shapes = _packed_shapes(blk, x)
    compiled = ferrodyn.compile(blk, backend=CountingBackend(backend))
    for _ in range(2):  # the compiling call, then a cache hit
        out, shapes = _packed_shapes(compiled, x)
        torch.testing.assert_close(out, ref)
        assert all(kind == "Tensor" for _, kind in shapes), shapes  # never a FakeTensor
        if backend == "eager":  # aot_eager saves what its joint graph decides
            assert shapes == ref_shapes


@pytest.mark.parametrize("compiler", [torch.compile, ferrodyn.compile])
def test_non_reentrant_checkpoint_backward_matches_eager(compiler):
    torch._dynamo.reset()
    lin = torch.nn.Linear(4, 4)

    def blk(x):
        return torch.relu(lin(x)) * 2

    def f(x):
        return checkpoint(blk, x, use_reentrant=False).sum()

    x = torch.randn(3, 4, requires_grad=True)
    f(x).backward()
    ref_x, ref_w = x.grad.clone(), lin.weight.grad.clone()
    x.grad = None
    lin.weight.grad = None
    backend = CountingBackend()
    out = compiler(f, backend=backend)(x)
    out.backward()
    torch.testing.assert_close(x.grad, ref_x)
    torch.testing.assert_close(lin.weight.grad, ref_w)
    assert backend.count >= 1


def test_torch_cond_in_compiled_code_does_not_compile_torch_internals():
    def g(x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))

    compiled = ferrodyn.compile(g, backend=CountingBackend())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "cache size limit" warning
        for sign in (1.0, -1.0, 1.0):
            x = torch.full((3,), sign)
            torch.testing.assert_close(compiled(x), g(x))


def test_generated_dataclass_and_namedtuple_methods_are_not_compile_roots():
    import collections
    import dataclasses

    from ferrodyn.convert_frame import _is_stdlib_generated

    @dataclasses.dataclass
    class P:
        a: int

    Q = collections.namedtuple("Q", "a b")

    def user(x):
        return x

    assert _is_stdlib_generated(P.__init__.__code__)
    assert _is_stdlib_generated(P.__eq__.__code__)
    assert _is_stdlib_generated(Q.__new__.__code__)
    assert not _is_stdlib_generated(user.__code__)
    ns: dict = {}
    exec("def h(x):\n    return x + 1\n", ns)  # user code from exec stays traceable
    assert not _is_stdlib_generated(ns["h"].__code__)

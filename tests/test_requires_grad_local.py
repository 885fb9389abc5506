"""`Tensor.requires_grad_()` (variables/requires_grad.py): on a tensor the frame made it is an
effect local to the graph (transformers' mra returns `torch.zeros_like(q).requires_grad_()`),
captured as torch.compile captures it; an output requiring grad that depends on such a leaf
breaks the graph at the call (as torch.compile, so aot backends stay exact); on inputs it is
refused unless it changes nothing. Results, `requires_grad`, `grad_fn` presence, gradients and
the inputs' flags afterwards are eager's; graph counts at most torch.compile's."""

import pytest
import torch
import torch._dynamo
from torch import nn

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _tensors(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for i in v for t in _tensors(i)]
    return []


def _check(got, want):
    assert type(got) is type(want)
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _check(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.requires_grad == want.requires_grad
        assert (got.grad_fn is None) == (want.grad_fn is None)
        assert got.is_leaf == want.is_leaf
        torch.testing.assert_close(got, want)
    else:
        assert got == want


def _run(fn, make, *, grad=True, inner="eager"):
    """fn eagerly, with ferrodyn and with torch.compile (twice each, fresh equal arguments):
    ferrodyn's results, the arguments' requires_grad afterwards and the gradients of a loss
    over the outputs that require grad are eager's. Returns (ferrodyn, torch) backends."""
    ours, theirs = CountingBackend(inner), CountingBackend(inner)
    torch._dynamo.reset()
    runs = {}
    for name, f in (("eager", fn), ("ferrodyn", ferrodyn.compile(fn, backend=ours)),
                    ("torch", torch.compile(fn, backend=theirs))):
        runs[name] = []
        for _ in range(2):
            args = make()
            with torch.set_grad_enabled(grad):
                out = f(*args)
            flags = [a.requires_grad for a in _tensors(args)]
            need = [t for t in _tensors(out) if t.requires_grad]
            leaves = [a for a in _tensors(args) if a.requires_grad]
            grads = None
            if need and leaves:
                loss = sum((t.float() * (i + 1)).sum() for i, t in enumerate(need))
                grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            runs[name].append((out, flags, grads))
    torch._dynamo.reset()
    for (out, flags, grads), (w_out, w_flags, w_grads) in zip(runs["ferrodyn"], runs["eager"]):
        _check(out, w_out)
        assert flags == w_flags
        assert (grads is None) == (w_grads is None)
        if grads is not None:
            for g, w in zip(grads, w_grads):
                assert (g is None) == (w is None)
                if w is not None:
                    torch.testing.assert_close(g, w)
    return ours, theirs


def _x(*shape, grad=False):
    def make():
        torch.manual_seed(0)
        return (torch.randn(*shape, requires_grad=grad),)
    return make


def _has_requires_grad_node(backend) -> bool:
    return any(n.op == "call_method" and n.target == "requires_grad_"
               for gm in backend.graphs for n in gm.graph.nodes)


class FallbackAttention(nn.Module):
    """mra's shape: a zero attention that requires grad, mixed with other paths."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def attention(self, q):
        return torch.zeros_like(q).requires_grad_()

    def forward(self, x):
        q = self.proj(x)
        a = self.attention(q)
        return (a + q).relu() * 2, a.requires_grad


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_fallback_zeros_under_no_grad_is_one_graph(inner):
    torch.manual_seed(0)
    net = FallbackAttention()
    ours, theirs = _run(net, _x(2, 8), grad=False, inner=inner)
    assert ours.count == 1 <= theirs.count
    assert _has_requires_grad_node(ours)


def test_leaf_consumed_in_graph_with_grad_enabled():
    def fn(x):
        w = torch.ones(3).requires_grad_()
        return (w * x).detach() + 1, w.requires_grad

    ours, theirs = _run(fn, _x(3, grad=True))
    assert ours.count == 1 <= theirs.count


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_leaf_leaking_as_output_breaks_at_the_call(inner):
    def fn(x):
        z = x.detach() * 2
        z.requires_grad_()
        return z * 3 + x, z

    ours, theirs = _run(fn, _x(4, grad=True), inner=inner)
    assert ours.count <= theirs.count
    assert not _has_requires_grad_node(ours)  # it ran eagerly between two graphs


def test_leaf_returned_itself_under_no_grad():
    fn = lambda x: torch.zeros_like(x).requires_grad_() if x.sum() is not None else None
    ours, theirs = _run(fn, _x(3), grad=False)
    assert ours.count <= theirs.count


def test_input_flag_change_is_refused_and_eager_effect_kept():
    def fn(x):
        y = x * 2
        x.requires_grad_()
        return y + 1

    ours, theirs = _run(fn, _x(3, grad=False))
    assert ours.count <= theirs.count
    assert not _has_requires_grad_node(ours)


@pytest.mark.parametrize("flag", [True, False])
def test_call_that_changes_nothing_is_a_no_op(flag):
    def fn(x):
        return x.requires_grad_(flag) * 2, torch.ones(2).requires_grad_(False) + 1

    ours, theirs = _run(fn, _x(3, grad=flag))
    assert ours.count == 1 <= theirs.count
    assert not _has_requires_grad_node(ours)


def test_view_of_a_made_tensor_before_and_after():
    def fn(x):
        z = x * 0 + 1
        before = z[:2]
        z.requires_grad_(True)
        after = z[:2]
        return before.requires_grad, after.requires_grad, (after * 4).detach()

    ours, theirs = _run(fn, _x(3), grad=True)
    assert ours.count <= theirs.count


@pytest.mark.parametrize("grad", [True, False])
def test_leaf_live_across_a_later_break_breaks_at_the_call(grad):
    def fn(x):
        z = x.detach() * 2
        z.requires_grad_()
        y = x + 1
        torch._dynamo.graph_break()
        return (z * y).sum(), z

    ours, theirs = _run(fn, _x(3, grad=True), grad=grad)
    assert ours.count == theirs.count  # not the whole frame eagerly
    assert not _has_requires_grad_node(ours)

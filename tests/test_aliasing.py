"""Graph inputs deduplicated by identity and the aliasing guard (rust/guards/aliasing.rs):
an entry compiled for distinct tensors does not run when two inputs are the same tensor or
share storage and an in-place op is involved (and the other way round)."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def f(a, b):
    a.add_(1)
    return b * 2


def _inputs(kind):
    if kind == "distinct":
        return torch.ones(4), torch.ones(4)
    if kind == "same":
        t = torch.ones(4)
        return t, t
    if kind == "view_prefix":
        base = torch.ones(8)
        return base, base[:4]
    if kind == "view_same_shape":
        base = torch.ones(4)
        return base, base.view(4)
    if kind == "view_offset":
        base = torch.ones(8)
        return base[4:], base[:4]
    raise AssertionError(kind)


SEQUENCES = [
    ("distinct", "same", "view_prefix", "view_same_shape", "distinct"),
    ("same", "distinct", "same"),
    ("view_same_shape", "distinct", "view_same_shape"),
    ("view_offset", "view_prefix", "view_offset"),
]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("seq", SEQUENCES, ids="-".join)
def test_inplace_with_aliased_inputs_matches_eager(seq, backend):
    cb = CountingBackend(backend)
    c = ferrodyn.compile(f, backend=cb)
    for kind in seq:
        a_e, b_e = _inputs(kind)
        a_c, b_c = _inputs(kind)
        want = f(a_e, b_e)
        got = c(a_c, b_c)
        assert torch.equal(got, want), kind
        assert torch.equal(a_c, a_e) and torch.equal(b_c, b_e), kind
    assert cb.count <= len(set(seq))  # one entry per aliasing pattern, reused on repeats


def test_same_tensor_twice_is_one_placeholder():
    cb = CountingBackend()
    t = torch.ones(3)
    c = ferrodyn.compile(lambda a, b: a + b, backend=cb)
    assert torch.equal(c(t, t), t + t)
    placeholders = [n for n in cb.graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 1
    # called with distinct tensors afterwards: the dedup must not leak
    u = torch.full((3,), 5.0)
    assert torch.equal(c(t, u), t + u)
    assert cb.count == 2


def test_graph_counts_match_torch_compile_for_same_tensor():
    def g(a, b):
        a.add_(1)
        return b * 2
    for compiler in ("ferrodyn", "torch"):
        cb = CountingBackend("aot_eager")
        torch._dynamo.reset()
        c = ferrodyn.compile(g, backend=cb) if compiler == "ferrodyn" else torch.compile(g, backend=cb)
        c(torch.ones(4), torch.ones(4))
        t = torch.ones(4)
        c(t, t)
        if compiler == "ferrodyn":
            ours = cb.count
        else:
            theirs = cb.count
    assert ours == theirs == 2


def test_aliasing_guard_explains_itself():
    from ferrodyn import _C
    b = _C.GuardBuilder({}, {})
    b.aliasing([b.local(0, "a"), b.local(1, "b")], [0, 1], [(0, 0), (1, 0)])
    tree = b.build()
    x, y = torch.ones(8), torch.ones(8)
    assert tree.check((x, y))
    assert not tree.check((x, x))
    assert "L['a'] and L['b'] are now the same object" in tree.explain((x, x))
    assert not tree.check((x, x[:4]))
    assert "now share storage" in tree.explain((x, x[:4]))
    assert tree.check((x[:4], y[4:]))


def test_aliasing_guard_storage_offsets():
    from ferrodyn import _C
    b = _C.GuardBuilder({}, {})
    base = torch.ones(8)
    b.aliasing([b.local(0, "a"), b.local(1, "b")], [0, 1], [(0, 0), (0, 4)])
    tree = b.build()
    other = torch.ones(8)
    assert tree.check((base[:4], base[4:]))
    assert tree.check((other[:4], other[4:]))
    assert not tree.check((base[:4], base[2:6]))
    assert "storage offset changed" in tree.explain((base[:4], base[2:6]))
    assert not tree.check((base[:4], other[4:]))


def test_storage_identity_read_directly():
    """The storage_ offset is located and verified at first use (else the Python fallback)."""
    from ferrodyn import _C
    if _C.tensor_fast_path():
        assert _C._aliasing_fast_path()


def test_is_between_inputs_is_guarded():
    cb = CountingBackend()
    c = ferrodyn.compile(lambda a, b, x: x + (1 if a is b else 2), backend=cb)
    xs, ys = [1], [1]
    one = torch.zeros(1)
    assert c(xs, xs, one).item() == 1
    assert c(xs, ys, one).item() == 2
    assert c(xs, xs, one).item() == 1


def test_many_inputs_take_the_linear_check():
    """More than 16 guarded values: the hashed O(n) check of the leaf must agree with eager."""
    def g(ts):
        ts[0].add_(1)
        return sum(t.sum() for t in ts[1:])
    cb = CountingBackend()
    c = ferrodyn.compile(g, backend=cb)
    for alias in (False, True, False, True):
        def make():
            ts = [torch.ones(2) for _ in range(20)]
            if alias:
                ts[7] = ts[0][:]  # a view of the mutated tensor
            return ts
        e, k = make(), make()
        assert torch.equal(c(k), g(e))
        assert all(torch.equal(a, b) for a, b in zip(k, e))
    assert cb.count == 2

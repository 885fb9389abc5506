"""Dynamic shapes end to end (python/ferrodyn/dynamic.py, symbolic_shapes.py,
variables/sym_int.py): compiled vs eager on the same inputs, graph counts against
torch.compile's on the same sequence (CountingBackend on both), guard texts and recompile
reasons, the three `dynamic=` policies and the marks."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


@pytest.fixture(autouse=True)
def _torch_reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run_both(fn, inputs, *, dynamic=None):
    """Run `fn` compiled by ferrodyn and by torch.compile on each input tuple; assert the
    results match eager; return (ferrodyn's graph count, torch's)."""
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours, dynamic=dynamic)
    ct = torch.compile(fn, backend=theirs, dynamic=dynamic)
    for args in inputs:
        expected = fn(*args)
        torch.testing.assert_close(cf(*args), expected)
        torch.testing.assert_close(ct(*args), expected)
    return ours.count, theirs.count


# ---- the issue's table ----------------------------------------------------------------------

def matmul_softmax(x):
    return (x @ x.t()).softmax(-1).sum(0)


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:]) * 2


def scale_shift(x, n):
    return x * n + n


def decode_step(q, k_cache, v_cache, k_new, v_new):
    k = torch.cat([k_cache, k_new], dim=1)
    v = torch.cat([v_cache, v_new], dim=1)
    att = (q @ k.transpose(-1, -2)) / k.shape[-1] ** 0.5
    return att.softmax(-1) @ v, k, v


def _decode_inputs():
    torch.manual_seed(0)
    for n in range(1, 12):
        yield (torch.randn(2, 1, 8), torch.randn(2, n, 8), torch.randn(2, n, 8),
               torch.randn(2, 1, 8), torch.randn(2, 1, 8))


TABLE = {
    "matmul_softmax batch 2..13": (matmul_softmax,
                                   lambda: [(torch.randn(b, 4),) for b in range(2, 14)]),
    "layer_norm lengths 3..14": (layer_norm,
                                 lambda: [(torch.randn(2, s, 8).transpose(1, 2).contiguous()
                                           .transpose(1, 2).contiguous()[:, :, :].clone()
                                           .reshape(2, s, 8).transpose(1, 2),) for s in range(3, 15)]),
    "x * n + n, n = 1..11": (scale_shift, lambda: [(torch.randn(3), n) for n in range(1, 12)]),
    "decode step, KV length 1..11": (decode_step, lambda: list(_decode_inputs())),
}


@pytest.mark.parametrize("name", list(TABLE))
@pytest.mark.parametrize("dynamic", [None, True])
def test_issue_table(name, dynamic):
    fn, inputs = TABLE[name]
    ours, theirs = _run_both(fn, inputs(), dynamic=dynamic)
    assert ours <= theirs, (ours, theirs)
    assert ours <= 3


def test_dynamic_false_specialises_every_size():
    ours, theirs = _run_both(matmul_softmax, [(torch.randn(b, 4),) for b in range(2, 6)],
                             dynamic=False)
    assert ours == theirs == 4


# ---- programs over dynamic sizes -------------------------------------------------------------

def broadcasting(x, y):
    return x + y.unsqueeze(0) * x.mean(0)


def views(x):
    b = x.shape[0]
    return x.view(b, -1, 2).transpose(1, 2).reshape(b, -1)[:, :3] + x.narrow(1, 0, 3)


def reshape_n(x, n):
    return x.reshape(-1, n).sum(1) + x.shape[0] // 2


def padding_mask(x, lengths):
    mask = torch.arange(x.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    return x.masked_fill(~mask.unsqueeze(-1), 0.0).sum(1) / lengths.unsqueeze(1)


def conv(x, w):
    return F.conv2d(x, w, padding=1).relu().mean((2, 3))


def cat_pieces(x, y):
    z = torch.cat([x, y, x[: x.shape[0] // 2]], dim=0)
    return z * z.shape[0], torch.zeros(x.size(0), 2) + z.size(0)


PROGRAMS = {
    "broadcasting": (broadcasting, lambda: [(torch.randn(b, 5), torch.randn(5)) for b in range(2, 7)]),
    "views": (views, lambda: [(torch.randn(b, 6),) for b in range(2, 7)]),
    "reshape(-1, n)": (reshape_n, lambda: [(torch.randn(n * 4), n) for n in range(2, 7)]),
    "padding mask": (padding_mask, lambda: [(torch.randn(3, s, 4),
                                             torch.tensor([1.0, float(s), 2.0]))
                                            for s in range(2, 7)]),
    "conv variable spatial size": (conv, lambda: [(torch.randn(1, 3, s, s + 1), torch.randn(4, 3, 3, 3))
                                                  for s in range(4, 9)]),
    "cat of dynamic pieces": (cat_pieces, lambda: [(torch.randn(b, 3), torch.randn(b + 1, 3))
                                                   for b in range(2, 7)]),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_programs_automatic_dynamic(name):
    fn, inputs = PROGRAMS[name]
    ours, theirs = _run_both(fn, inputs())
    assert ours <= theirs, (ours, theirs)


def test_shape_arithmetic_is_symbolic_in_the_graph():
    cb = CountingBackend()
    f = ferrodyn.compile(reshape_n, backend=cb, dynamic=True)
    for n in (2, 3, 5):
        x = torch.randn(n * 4)
        torch.testing.assert_close(f(x, n), reshape_n(x, n))
    assert cb.count == 1
    placeholders = [n for n in cb.graphs[0].graph.nodes if n.op == "placeholder"]
    assert any(isinstance(p.meta["example_value"], torch.SymInt) for p in placeholders)
    assert not any(isinstance(a, torch.SymInt) for n in cb.graphs[0].graph.nodes for a in n.args)


def test_returning_sizes_and_ints():
    def f(x, n):
        return x.shape, x.size(0) * n, n, x.size()

    cf = ferrodyn.compile(f, backend="eager", dynamic=True)
    for b, n in ((3, 4), (5, 7)):
        x = torch.randn(b, 2)
        got, want = cf(x, n), f(x, n)
        assert got == want
        assert type(got[0]) is torch.Size and type(got[1]) is int


def test_zero_one_are_specialised_and_then_dynamic_again():
    cb = CountingBackend()
    f = ferrodyn.compile(matmul_softmax, backend=cb, dynamic=True)
    for b in (1, 4, 5, 1, 6):
        x = torch.randn(b, 3)
        torch.testing.assert_close(f(x), matmul_softmax(x))
    assert cb.count == 2  # size 1 (specialised) and s0 >= 2


def test_symbolic_condition_guards():
    def f(x):
        if x.shape[0] > 4:
            return x * 2
        return x - 1

    ours, theirs = _run_both(f, [(torch.randn(b),) for b in (2, 3, 6, 7, 3)], dynamic=True)
    assert ours == theirs == 2


def test_equal_sizes_are_guarded_equal():
    def f(x, y):
        return x + y  # needs x.size(0) == y.size(0)

    ours, theirs = _run_both(f, [(torch.randn(4), torch.randn(4)), (torch.randn(5), torch.randn(5)),
                                 (torch.randn(1), torch.randn(6))], dynamic=True)
    assert ours <= theirs
    cf = ferrodyn.compile(f, backend="eager", dynamic=True)
    cf(torch.randn(4), torch.randn(4))
    from ferrodyn import _C
    tree = _C.cache_entries(f.__code__)[0].guards
    assert "L['y'].size()[0] == L['x'].size()[0]" in tree.leaves()
    assert tree.explain([torch.randn(5), torch.randn(6)]) == \
        "L['y'].size()[0] == L['x'].size()[0] (got L['y'].size()[0] = 6, L['x'].size()[0] = 5)"


# ---- policies, marks -------------------------------------------------------------------------

def test_mark_dynamic_compiles_once():
    cb = CountingBackend()
    f = ferrodyn.compile(matmul_softmax, backend=cb)
    for b in range(2, 7):
        x = torch.randn(b, 4)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(f(x), matmul_softmax(x))
    assert cb.count == 1


def test_ferrodyn_mark_dynamic_and_mark_static():
    cb = CountingBackend()
    f = ferrodyn.compile(matmul_softmax, backend=cb, dynamic=True)
    for b in range(2, 5):
        x = torch.randn(b, 4)
        ferrodyn.mark_static(x, 0)
        torch.testing.assert_close(f(x), matmul_softmax(x))
    assert cb.count == 3
    cb2 = CountingBackend()
    g = ferrodyn.compile(lambda x: x * 2, backend=cb2)
    for b in range(2, 5):
        x = torch.randn(b)
        ferrodyn.maybe_mark_dynamic(x, 0)
        torch.testing.assert_close(g(x), x * 2)
    assert cb2.count == 1


def test_mark_dynamic_specialised_is_an_error():
    def f(x):
        return x.view(3, -1) if x.shape[0] == 6 else x

    x = torch.randn(6)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(Exception, match=r"L\['x'\].size\(\)\[0\]"):
        ferrodyn.compile(f, backend="eager")(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"L\['x'\].size\(\)\[0\]"):
        torch.compile(f, backend="eager")(x)


def test_mark_dynamic_bad_dim():
    with pytest.raises(ValueError, match="out of range"):
        ferrodyn.mark_dynamic(torch.randn(3), 2)


def test_parameters_stay_static():
    lin = torch.nn.Linear(4, 3)
    cb = CountingBackend()
    m = ferrodyn.compile(lin, backend=cb, dynamic=True)
    for b in (2, 3, 4):
        x = torch.randn(b, 4)
        torch.testing.assert_close(m(x), lin(x))
    assert cb.count == 1
    tree_text = "\n".join(ferrodyn.explain(lin)(torch.randn(2, 4)).guards)
    assert "size=[3, 4]" in tree_text  # the weight's sizes are matched as constants


# ---- guards, explain texts, recompile reasons ------------------------------------------------

def test_guard_texts_and_recompile_reasons(caplog):
    ferrodyn.logs.set_logs("recompiles,dynamic", handler=False)
    try:
        cb = CountingBackend()
        f = ferrodyn.compile(scale_shift, backend=cb)
        with caplog.at_level(logging.DEBUG, logger="ferrodyn"):
            for n in (3, 4, 5, 1):
                f(torch.randn(2), n)
        text = caplog.text
    finally:
        ferrodyn.logs.set_logs("", handler=False)
    assert "L['n'] == 3 (got 4)" in text
    assert "L['n'] changed 3 -> 4" in text
    assert cb.count == 2  # n = 1 hits the SymInt entry (ints are not 0/1-specialised)


def test_dynamic_tensor_guard_explain():
    cb = CountingBackend()
    f = ferrodyn.compile(matmul_softmax, backend=cb, dynamic=True)
    f(torch.randn(3, 4))
    from ferrodyn import _C
    entry = _C.cache_entries(matmul_softmax.__code__)[0]
    leaves = entry.guards.leaves()
    assert "2 <= L['x'].size()[0]" in leaves
    assert any("size=[None, None]" in leaf for leaf in leaves)
    assert "L['x'].stride()[0] == L['x'].size()[1]" in leaves
    assert entry.guards.explain([torch.randn(1, 4)]) == "2 <= L['x'].size()[0] (got 1)"
    assert "(got torch.float64)" in entry.guards.explain([torch.randn(5, 3, dtype=torch.float64)])
    assert entry.guards.check([torch.randn(9, 4)])
    assert not entry.guards.check([torch.randn(4, 9).t()])  # strides differ


# ---- Inductor on a dynamic graph (one small compile: Inductor is slow here) ------------------

def test_inductor_compiles_one_dynamic_kernel():
    def f(x, n):
        return (x * n).relu().sum(0) + x.shape[0]

    cb = CountingBackend("inductor")
    cf = ferrodyn.compile(f, backend=cb, dynamic=True)
    for b, n in ((3, 2), (5, 3), (8, 4)):
        x = torch.randn(b, 4)
        torch.testing.assert_close(cf(x, n), f(x, n))
    assert cb.count == 1

"""SymInt operations under dynamic shapes (variables/sym_int.py, the symbolic parts of
builtins.py and tensor.py): each program runs compiled by ferrodyn and by torch.compile over one
sequence of sizes (automatic dynamic and dynamic=True), results equal to eager, and ferrodyn's
graph count equal to torch.compile's (CountingBackend on both). Uses that need the number
(`range(s)`, f-strings) specialise under a shape guard, as torch does; the others stay symbolic.
"""

from __future__ import annotations

import math

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

SIZES = [2, 3, 5, 8]


@pytest.fixture(autouse=True)
def _torch_reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run_both(fn, inputs, *, dynamic=None):
    """(ferrodyn's graph count, torch.compile's) over `inputs`; every result equals eager."""
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours, dynamic=dynamic)
    ct = torch.compile(fn, backend=theirs, dynamic=dynamic)
    for args in inputs:
        expected = fn(*args)
        torch.testing.assert_close(cf(*args), expected, rtol=0, atol=0)
        torch.testing.assert_close(ct(*args), expected, rtol=0, atol=0)
    return ours.count, theirs.count


# ---- programs over a tensor's size ------------------------------------------------------------

def loop_range(x):
    acc = x
    for i in range(x.shape[0]):
        acc = acc + i
    return acc


def int_of(x):
    return x * int(x.shape[0])


def float_of(x):
    return x * float(x.shape[0])


def max_of(x):
    return x.new_ones(max(x.shape[0], 1)) + x.shape[0]


def min_of(x):
    return x[: min(x.shape[0], 4, x.shape[1] + 10)] * 2


def floordiv(x):
    return x[: x.shape[0] // 2] + 1


def mod(x):
    return x * (x.shape[0] % 8)


def fstring(x):
    return x * len(f"n={x.shape[0]}")


def str_of(x):
    return x * len(str(x.shape[0]))


def arange(x):
    return torch.arange(x.shape[0]) + x[:, 0]


def view(x):
    return x.view(x.shape[0], -1) * 2


def new_zeros(x):
    return x.new_zeros(x.shape[0], 3) + 1


def full(x):
    return torch.full((x.shape[0],), 2.0) + x[:, 0]


def compare_if(x):
    if x.shape[0] > 4:
        return x + 1
    return x - 1


def ceil_half(x):
    return x.new_ones(math.ceil(x.shape[0] / 2)) * math.floor(x.shape[0] / 3)


def bool_of(x):
    if bool(x.shape[0]):
        return x + 1
    return x - 1


# torch.compile breaks the graph at str(SymInt) (one graph more); ferrodyn specialises it
FEWER_THAN_TORCH = {str_of}
TENSOR_PROGRAMS = [loop_range, int_of, float_of, max_of, min_of, floordiv, mod, fstring, str_of,
                   arange, view, new_zeros, full, compare_if, ceil_half, bool_of]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("fn", TENSOR_PROGRAMS, ids=lambda f: f.__name__)
def test_symint_op_graph_count_matches_torch(fn, dynamic):
    ours, theirs = _run_both(fn, [(torch.randn(n, 3),) for n in SIZES], dynamic=dynamic)
    if fn in FEWER_THAN_TORCH:
        assert ours < theirs
    else:
        assert ours == theirs


# ---- programs over a Python int argument ----------------------------------------------------

def int_arg_arith(x, n):
    return x * n + max(n, 2) + min(n, 7) + n // 3 + n % 4 + int(n)


def int_arg_range(x, n):
    for i in range(n):
        x = x + i
    return x


def int_arg_fstring(x, n):
    return x * len(f"{n:>4}")


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("fn", [int_arg_arith, int_arg_range, int_arg_fstring],
                         ids=lambda f: f.__name__)
def test_int_argument_graph_count_matches_torch(fn, dynamic):
    ours, theirs = _run_both(fn, [(torch.randn(4, 3), n) for n in SIZES], dynamic=dynamic)
    assert ours == theirs


# ---- symbolic results are symbolic -----------------------------------------------------------

def test_int_max_ceil_stay_symbolic_in_one_graph():
    """int(s), max(s, 1), math.ceil(s / 2) are graph values: one graph serves every size (from
    3 up: at 2, ceil(2 / 2) == 1 is a broadcasting size both specialise)."""
    def f(x):
        n = max(int(x.shape[0]), 1)
        return x.new_zeros(math.ceil(n / 2), 2) + n

    ours, theirs = _run_both(f, [(torch.randn(n, 2),) for n in SIZES[1:]], dynamic=True)
    assert ours == theirs == 1
    backend = CountingBackend()
    ferrodyn.compile(f, backend=backend, dynamic=True)(torch.randn(5, 2))
    targets = {node.target for node in backend.graphs[0].graph.nodes}
    assert torch.sym_max in targets and math.ceil in targets


# ---- specialisation keeps its guard (wrong values before) ----------------------------------

def test_size_specialised_by_comparison_keeps_its_guard():
    """`x.shape[0] == 3` specialises the dynamic dim to 3 in the ShapeEnv: the entry is guarded
    on that size even though the dim was left out of the tensor_match leaf."""
    def f(x):
        if x.shape[0] == 3:
            return x + 100
        return x - 1

    ours, theirs = _run_both(f, [(torch.randn(n, 3),) for n in [2, 3, 5, 3, 4, 7]])
    assert ours == theirs


def test_range_specialises_only_its_symbol():
    """range(x.shape[0]) specialises that size; y's dynamic size stays symbolic (torch: one
    graph per size of x, whatever y's size)."""
    def f(x, y):
        for i in range(x.shape[0]):
            y = y + i
        return y * y.shape[0]

    inputs = [(torch.randn(2), torch.randn(n)) for n in SIZES] + \
        [(torch.randn(3), torch.randn(n)) for n in SIZES]
    ours, theirs = _run_both(f, inputs, dynamic=True)
    assert ours == theirs


def test_specialised_size_guard_is_explained(caplog):
    """The recompile reason names the source of the specialised size."""
    import logging
    from ferrodyn.logs import recompiles_log

    cf = ferrodyn.compile(loop_range, backend=CountingBackend(), dynamic=True)
    cf(torch.randn(3, 2))
    with caplog.at_level(logging.DEBUG, logger=recompiles_log.name):
        cf(torch.randn(4, 2))
    assert "L['x'].size()[0] == 3" in caplog.text


def test_mark_dynamic_dim_specialised_by_range_is_an_error():
    """Specialising a mark_dynamic dim is an error naming the cause, as in torch.compile."""
    def f(x):
        for i in range(x.shape[0]):
            x = x + i
        return x

    x = torch.randn(4, 3)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(Exception) as theirs:
        torch.compile(f, backend="eager")(x)
    with pytest.raises(Exception) as ours:
        ferrodyn.compile(f, backend="eager")(x)
    assert type(ours.value).__name__ == type(theirs.value).__name__ or \
        "L['x'].size()[0]" in str(ours.value)

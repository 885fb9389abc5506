"""Graph breaks that resume (issue 8): every row of the issue's table compiled with ferrodyn
and with torch.compile (CountingBackend on both) and compared with eager: results, gradients,
grad mode, graph counts (at most torch.compile's) and captured ops (at least torch.compile's);
breaks in loops, with new objects live across them, and frames with cell variables. Aliased
new objects, closures, try and `with` blocks: test_graph_breaks_{aliasing,closures,
handlers,cells}.py."""

import sys

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from ferrodyn import Unsupported, resume

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def n_ops(backend):
    """Ops captured (grad-mode switches, which torch.compile records and a resumed `with`
    block does not repeat, are not counted)."""
    return sum(1 for g in backend.graphs for n in g.graph.nodes
               if n.op in ("call_function", "call_method", "call_module")
               and n.target is not torch._C._set_grad_enabled)


def both(fn, *args, expect_graphs=None, at_most_torch=True):
    """Run fn eagerly, under ferrodyn and under torch.compile (twice each: capture, then the
    cached entries); compare results; return the two backends. `at_most_torch`: ferrodyn
    makes no more graphs than torch.compile (not for breaks inside loops, where torch.compile
    runs the whole frame eagerly and captures nothing)."""
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    want = fn(*args)
    cf = ferrodyn.compile(fn, backend=ours)
    ct = torch.compile(fn, backend=theirs)
    for _ in range(2):
        got = cf(*args)
        assert_close(got, want)
        ct(*args)
    if at_most_torch:
        assert ours.count <= theirs.count, (ours.count, theirs.count)
    assert n_ops(ours) >= n_ops(theirs), (n_ops(ours), n_ops(theirs))
    if expect_graphs is not None:
        assert ours.count == expect_graphs
    return ours, theirs


def assert_close(got, want):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.requires_grad == want.requires_grad
        torch.testing.assert_close(got, want)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_close(got[k], want[k])
    else:
        assert got == want


# -- the table ------------------------------------------------------------------------

def print_between(x):
    y = torch.sin(x) + 1
    print("between")
    return torch.cos(y) * 2


def item_if(x):
    y = x * 2
    if y.sum().item() > 1:
        y = y + 3
    return y - 1


def tensor_if(x):
    y = x * 2
    if y.sum() > 0:
        z = y + 1
    else:
        z = y - 1
    return z * 3


def helper_prints(y):
    y = y + 1
    print("in helper")
    return y * 2


def calls_printing_helper(x):
    a = x.sin()
    b = helper_prints(a)
    return b.cos()


def break_in_no_grad(x):
    y = x * 2
    with torch.no_grad():
        z = y * 3
        torch._dynamo.graph_break()
        z = z + y
    return z + x, torch.is_grad_enabled()


def explicit_break(x):
    y = x.relu() + 1
    torch._dynamo.graph_break()
    return y * y


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.mean() > 0:
            return h.relu()
        return h.tanh()


@pytest.mark.parametrize("fn,graphs", [
    (print_between, 2), (item_if, None), (tensor_if, None), (calls_printing_helper, 2),
    (explicit_break, 2),
])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_table_rows_match_eager_with_at_most_torch_compiles_graphs(fn, graphs, sign, capsys):
    x = torch.rand(4) * sign + 0.1 * sign
    both(fn, x, expect_graphs=graphs)
    out = capsys.readouterr().out
    # once per call: eager, ferrodyn twice, torch.compile twice
    assert out.count("between") in (0, 5) and out.count("in helper") in (0, 5)


def test_break_inside_no_grad_keeps_grad_mode_and_requires_grad():
    x = torch.randn(3, requires_grad=True)
    ours, theirs = both(break_in_no_grad, x, expect_graphs=2)
    assert torch.is_grad_enabled()


def test_module_branching_on_a_tensor_value():
    torch.manual_seed(0)
    m = Branchy()
    for x in (torch.randn(2, 4), torch.randn(2, 4) + 5, torch.randn(2, 4) - 5):
        ours, theirs = both(m, x)
        assert ours.count <= 2


def two_graphs(x, w):
    h = torch.tanh(x @ w)
    torch._dynamo.graph_break()
    return (h * h).sum()


def test_gradients_flow_through_two_graphs():
    x = torch.randn(3, 4)
    w1 = torch.randn(4, 2, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_(True)
    two_graphs(x, w1).backward()
    ours = CountingBackend()
    ferrodyn.compile(two_graphs, backend=ours)(x, w2).backward()
    assert ours.count == 2
    torch.testing.assert_close(w2.grad, w1.grad)


def test_fullgraph_still_raises_at_the_first_break():
    with pytest.raises(Unsupported, match="print"):
        ferrodyn.compile(print_between, backend=CountingBackend(), fullgraph=True)(torch.randn(2))


def test_ferrodyn_graph_break_breaks_and_is_a_no_op_eagerly():
    def f(x):
        y = x + 1
        ferrodyn.graph_break()
        return y * 2

    ours = CountingBackend()
    x = torch.randn(3)
    assert ferrodyn.graph_break() is None
    torch.testing.assert_close(ferrodyn.compile(f, backend=ours)(x), f(x))
    assert ours.count == 2


def test_explain_lists_each_break_with_reason_and_line():
    report = ferrodyn.explain(print_between)(torch.randn(2))
    assert report.graph_count == 2 and report.graph_break_count == 1
    line = print_between.__code__.co_firstlineno + 2
    assert f"{__file__}:{line}" in report.break_reasons[0] and "print" in report.break_reasons[0]


# -- loops, live objects ------------------------------------------------------------------------

def loop_break(x, n: int):
    for i in range(n):
        x = x * 2 + i
        torch._dynamo.graph_break()
        x = x.sin()
    return x


def test_break_in_a_loop_resumes_inside_the_loop():
    ours, theirs = both(loop_break, torch.randn(3), 3, at_most_torch=False)
    assert ours.count >= 4  # one graph before the loop's first break, then one per iteration


def new_objects(x):
    acc = [x + 1, (x * 3, "tag")]
    cfg = {"scale": 3, "t": x * 2}
    print("break")
    return acc[0] * cfg["scale"] + cfg["t"], acc[1][1], acc, cfg


def test_new_objects_live_across_a_break():
    ours, _ = both(new_objects, torch.randn(3))
    assert ours.count == 2  # before the break (objects rebuilt from its outputs), and after


def in_try(x):
    y = x + 1
    try:
        print("break")
        y = y * 2
    except RuntimeError:
        y = y * 0
    return y


def with_cell(x):
    y = x + 1
    scale = lambda t: t * y  # noqa: E731  (y is a cell of this frame)
    print("break")
    return scale(x)


def test_break_in_a_frame_with_a_cell_resumes():
    ours, theirs = both(with_cell, torch.randn(3))  # tests/test_graph_breaks_cells.py
    assert ours.count == theirs.count == 2


def test_break_in_a_try_block_resumes():
    ours, theirs = both(in_try, torch.randn(3), at_most_torch=False)
    assert ours.count == 2 and theirs.count == 0  # torch.compile runs the frame eagerly


def test_error_in_the_broken_instruction_inside_no_grad_restores_grad_mode():
    def boom():
        raise ValueError("boom")

    def f(x):
        y = x + 1
        with torch.no_grad():
            y = y * 2
            boom()
        return y

    g = ferrodyn.compile(f, backend=CountingBackend())
    with pytest.raises(ValueError, match="boom"):
        g(torch.randn(2))
    assert torch.is_grad_enabled()


def test_resume_code_is_cached_per_code_and_offset():
    ours = CountingBackend()
    c = ferrodyn.compile(explicit_break, backend=ours)
    c(torch.randn(3))
    c(torch.randn(5))  # a recompile of both frames
    resumed = {id(g.graph) for g in ours.graphs}
    assert ours.count == 4 and len(resumed) == 4
    codes = [k for k in resume._ORIGIN if resume.origin(k)[0] is explicit_break.__code__]
    assert len(codes) == 1


def test_data_dependent_if_inside_a_loop_with_recompiles():
    def f(x):
        for _ in range(3):
            if x.sum() > 0:
                x = x - 1.5
            else:
                x = x + 1
        return x

    for x in (torch.ones(3), -torch.ones(3), torch.full((3,), 2.0)):
        both(f, x, at_most_torch=False)


# -- breaks inside inlined calls (nested): every level resumes ----------------------------------

def inner_no_grad(h):
    h = h * 2
    with torch.no_grad():
        k = h + 1
        torch._dynamo.graph_break()
        k = k * h
    return k - h


def middle(h, n: int):
    acc = h
    for i in range(n):
        acc = acc + i
    return inner_no_grad(acc) + 1


def outer(x):
    y = x.cos()
    z = middle(y, 2)
    return z.sum(), y


def test_nested_break_resumes_every_level():
    for x in (torch.randn(3), torch.randn(3, requires_grad=True)):
        ours, theirs = both(outer, x)
        # one graph before the break, one after it (every level's resume function in it)
        assert ours.count == 2 and theirs.count == 6
    assert torch.is_grad_enabled()


def test_nested_break_error_restores_grad_mode():
    def boom(h):
        with torch.no_grad():
            h = h * 2
            raise_it()
        return h

    def raise_it():
        raise KeyError("inner")

    def f(x):
        return boom(x + 1) * 3

    with pytest.raises(KeyError, match="inner"):
        ferrodyn.compile(f, backend=CountingBackend())(torch.randn(2))
    assert torch.is_grad_enabled()


def test_module_method_that_prints_resumes_both_levels(capsys):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def helper(self, h):
            print("helper")
            return h * 2

        def forward(self, x):
            return self.helper(self.fc(x)).relu()

    torch.manual_seed(0)
    ours, theirs = both(M(), torch.randn(2, 3))
    assert ours.count == 2 and theirs.count == 3


def test_a_graph_whose_outputs_are_unused_still_runs_its_in_place_ops():
    """(A wrong value found on the way: the entry skipped a graph none of whose outputs was
    returned, dropping in-place updates of the inputs; a resumed frame often ends that way.)"""
    def f(x, y):
        x.add_(y)
        y.mul_(2)

    xs, ys = [torch.zeros(3) for _ in range(3)], [torch.ones(3) for _ in range(3)]
    f(xs[0], ys[0])
    ours, theirs = CountingBackend(), CountingBackend()
    assert ferrodyn.compile(f, backend=ours)(xs[1], ys[1]) is None
    torch.compile(f, backend=theirs)(xs[2], ys[2])
    for x, y in zip(xs[1:], ys[1:]):
        torch.testing.assert_close(x, xs[0])
        torch.testing.assert_close(y, ys[0])
    assert ours.count == theirs.count == 1


def grad_switch_before_break(x):
    with torch.no_grad():
        a = x * 2              # the graph switches grad mode off and back on
    torch.set_grad_enabled(False)
    b = x * 3                  # no grad from here on, across the break
    torch._dynamo.graph_break()
    c = x * 4
    torch.set_grad_enabled(True)
    return a, b, c, x * 5


@pytest.mark.parametrize("outer_grad", [True, False])
def test_grad_mode_at_the_break_is_set_only_when_it_differs(outer_grad):
    """The entry skips setting grad mode at the break when it is the guarded one; it must
    still set it when the traced code changed it (here: off at the break)."""
    x = torch.randn(3, requires_grad=True)
    with torch.set_grad_enabled(outer_grad):
        want = grad_switch_before_break(x)
        torch.set_grad_enabled(outer_grad)
        c = ferrodyn.compile(grad_switch_before_break, backend=CountingBackend())
        for _ in range(2):
            got = c(x)
            torch.set_grad_enabled(outer_grad)
            assert [t.requires_grad for t in got] == [t.requires_grad for t in want]
            assert_close(got, want)

"""Nested graph breaks (issue 8): a break N calls deep costs two graphs, as torch.compile's
`nested_graph_breaks`: the graph before the break, and one after it, the root's resume function
inlining every inner level's (resume.resume_code's `nested_call` prologue). Each test compares
results with eager and graph counts with torch.compile (default and with nested graph breaks)
in the same test."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from ferrodyn import resume

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def run_all(fn, *argsets, calls=2, at_most_torch=True):
    """Eager vs ferrodyn vs torch.compile (default and nested_graph_breaks) on each argument
    set, `calls` times each; returns the three backends."""
    torch._dynamo.reset()
    ours, theirs, nested = CountingBackend(), CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    ct = torch.compile(fn, backend=theirs)
    for args in argsets:
        want = fn(*args)
        for _ in range(calls):
            torch.testing.assert_close(cf(*args), want)
            ct(*args)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(nested_graph_breaks=True):
        cn = torch.compile(fn, backend=nested)
        for args in argsets:
            for _ in range(calls):
                cn(*args)
    if at_most_torch:
        assert ours.count <= theirs.count
    return ours, theirs, nested


def leaf(y):
    y = y + 1
    print("leaf")
    return y * 2


def depth1(x):
    a = x.sin()
    b = leaf(a)
    return b.cos()


def mid2(y, k):
    z = y * k
    return leaf(z) + z


def depth2(x):
    a = x.sin()
    return mid2(a, 3).cos(), a


def mid3(y):
    w = y - 0.5
    r = mid2(w, 2)
    return r * w


def depth3(x):
    a = x.exp()
    out = mid3(a)
    return out + a


@pytest.mark.parametrize("fn", [depth1, depth2, depth3])
def test_helper_chain_that_prints_costs_two_graphs(fn, capsys):
    ours, theirs, nested = run_all(fn, (torch.randn(3),))
    assert ours.count == nested.count == 2
    assert theirs.count > 2
    # printed once per call: eager, ferrodyn twice, torch.compile four times
    assert capsys.readouterr().out.count("leaf") == 7


def test_ops_after_the_break_at_every_level_are_in_the_second_graph():
    ours, _, _ = run_all(depth2, (torch.randn(3),))
    after = [n.target for n in ours.graphs[1].graph.nodes if n.op in ("call_function", "call_method")]
    assert len(after) == 3  # leaf's y * 2, mid2's + z, depth2's .cos()


def twice(y):
    y = y + 1
    print("one")
    y = y * 3
    print("two")
    return y - 1


def calls_twice(x):
    h = x.relu()
    return twice(h) * h


def test_two_breaks_in_a_helper():
    ours, theirs, nested = run_all(calls_twice, (torch.randn(4),))
    assert ours.count == nested.count == 3


def branches(y):
    if y.sum() > 0:
        return y * 2
    return y - 2


def calls_branches(x):
    z = x + 1
    return branches(z).sum() + z.mean()


def test_data_dependent_branch_in_a_helper():
    ours, _, nested = run_all(calls_branches, (torch.ones(3),), (-torch.ones(3) * 5,))
    assert ours.count <= nested.count + 1


def unused_result(y):
    print("unused")
    y.add_(1)


def calls_for_effect(x):
    x = x * 1
    unused_result(x)
    return x * 2


def test_helper_called_for_its_effect():
    run_all(calls_for_effect, (torch.randn(3),))


def kw_helper(y, *, scale):
    print("kw")
    return y * scale


def calls_kw(x):
    return kw_helper(x.cos(), scale=4) + 1


def test_helper_called_with_keywords():
    ours, _, _ = run_all(calls_kw, (torch.randn(3),))
    assert ours.count == 2


def calls_in_loop(x):
    for i in range(3):
        x = leaf(x) + i
    return x


def test_helper_that_prints_called_in_a_loop():
    """torch.compile runs a frame with a break inside a loop eagerly (its graphs are the
    helper's two); ferrodyn resumes inside the loop: more graphs, more ops captured, and a
    steady state (a third call compiles nothing)."""
    ours, theirs, nested = run_all(calls_in_loop, (torch.randn(3),), at_most_torch=False)
    n = ours.count
    ferrodyn.compile(calls_in_loop, backend=ours)(torch.randn(3))
    assert ours.count == n


def raises_after(y):
    print("before raising")
    if y.shape[0] == 3:
        raise ValueError("after the break")
    return y


def calls_raising(x):
    return raises_after(x + 1) * 2


def test_exception_after_the_break_propagates():
    c = ferrodyn.compile(calls_raising, backend=CountingBackend())
    for _ in range(2):
        with pytest.raises(ValueError, match="after the break"):
            c(torch.randn(3))
    torch.testing.assert_close(c(torch.ones(2)), calls_raising(torch.ones(2)))


def test_recompile_reuses_the_resume_functions():
    """A second entry of the root (new shapes) hands over the same inner resume function
    object, so the root's resume function, which guards its identity, does not recompile
    for that reason: 2 graphs per shape."""
    ours, _, nested = run_all(depth2, (torch.randn(3),), (torch.randn(2, 5),))
    assert ours.count == nested.count == 4
    codes = [c for c in list(resume._ORIGIN) if resume.origin(c)[0] is mid2.__code__]
    assert len(codes) == 1


def test_gradients_through_a_nested_break():
    def f(x, w):
        return mid2(x @ w, 2).sum()

    x = torch.randn(3, 4)
    w1 = torch.randn(4, 2, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_(True)
    f(x, w1).backward()
    ours = CountingBackend()
    ferrodyn.compile(f, backend=ours)(x, w2).backward()
    assert ours.count == 2
    torch.testing.assert_close(w2.grad, w1.grad)

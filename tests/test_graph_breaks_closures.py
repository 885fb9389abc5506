"""Graph breaks in closures (issue 8): a frame with free variables resumes in a function that
takes the frame's own cells as arguments, so `nonlocal` writes before and after the break
reach the same cells (seen by other closures sharing them), as in eager. Frames with cell
variables of their own and inlined closures: test_graph_breaks_cells.py.
Each test compares with eager (a twin closure from the same factory) and with torch.compile's
graph count."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def make_scaled(scale):
    bias = torch.ones(3)

    def f(x):
        nonlocal bias
        y = x * scale + bias
        bias = bias + 1          # a cell write before the break (replayed before it)
        print("break")
        out = y * scale - bias
        bias = bias * 2          # and one after it (in the resume function)
        return out

    def read():
        return bias

    return f, read


def twins(factory, *args):
    return factory(*args), factory(*args)


def test_closure_resumes_with_its_own_cells(capsys):
    (f, read), (g, read_g) = twins(make_scaled, 2.0)
    (h, read_h), _ = twins(make_scaled, 2.0)
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    cf, ct = ferrodyn.compile(f, backend=ours), torch.compile(h, backend=theirs)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(cf(x), g(x))
        torch.testing.assert_close(read(), read_g())  # the same cell, written on both sides
        ct(x)
    torch.testing.assert_close(read_h(), read_g())
    assert ours.count == 2 and ours.count <= theirs.count


def test_two_closures_of_one_code_keep_their_own_cells():
    (f1, r1), (e1, re1) = twins(make_scaled, 3.0)
    (f2, r2), (e2, re2) = twins(make_scaled, 3.0)
    ours = CountingBackend()
    c1, c2 = ferrodyn.compile(f1, backend=ours), ferrodyn.compile(f2, backend=ours)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(c1(x), e1(x))
    torch.testing.assert_close(c2(x), e2(x))
    torch.testing.assert_close(r1(), re1())
    torch.testing.assert_close(r2(), re2())


def make_inlined():
    k = torch.full((3,), 2.0)

    def helper(y):
        print("inner")
        return y * k

    def f(x):
        return helper(x + 1) - 1

    return f


def test_closure_inlined_below_the_root_still_gives_eager_values():
    f, g = make_inlined(), make_inlined()
    ours, theirs = CountingBackend(), CountingBackend()
    x = torch.randn(3)
    torch.testing.assert_close(ferrodyn.compile(f, backend=ours)(x), g(x))
    torch.compile(make_inlined(), backend=theirs)(x)
    assert ours.count <= theirs.count


def with_cells(x):
    y = x + 1
    scale = lambda t: t * y  # noqa: E731  (y is a cell of this frame)
    print("break")
    return scale(x)


def test_frame_with_cell_variables_gives_eager_values():
    x = torch.randn(3)
    torch.testing.assert_close(ferrodyn.compile(with_cells, backend=CountingBackend())(x),
                               with_cells(x))

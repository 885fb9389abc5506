"""Graph breaks inside `for` loops (issue 8): the loop's iterator is handed to the resume
function as a `resume.LoopRest`, iterated lazily (item k guarded when the loop reaches it,
the length only at the end) and its int items dynamic after one recompile, so the resume
function reaches a steady state: a bounded number of entries, whatever the iteration count,
hit on later iterations and calls. torch.compile runs such frames eagerly; each test
compares results with eager and counts graphs."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def loop_break(x, n: int):
    for i in range(n):
        x = x * 2 + i
        torch._dynamo.graph_break()
        x = x.sin()
    return x


def over_tensors(x, ws):
    for w in ws:
        x = x @ w
        print("step")
        x = x.relu()
    return x


def leaf(y):
    y = y + 1
    print("leaf")
    return y * 2


def calls_in_loop(x, n: int):
    for i in range(n):
        x = leaf(x) + i
    return x


def parity(x, n: int):
    for i in range(n):
        torch._dynamo.graph_break()
        if i % 2 == 0:   # the dynamic loop counter decides Python control flow
            x = x + i
        else:
            x = x * 0.5
    return x


def run(fn, *args):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    torch.testing.assert_close(cf(*args), fn(*args))
    first = ours.count
    torch.testing.assert_close(cf(*args), fn(*args))
    assert ours.count == first  # steady: a second call compiles nothing
    torch.compile(fn, backend=theirs)(*args)
    return ours.count, theirs.count


@pytest.mark.parametrize("n", [6, 20])
def test_loop_counter_does_not_specialise_the_resume_function(n, capsys):
    ours, theirs = run(loop_break, torch.randn(3), n)
    assert ours == 4   # root, then the resume function: first value, dynamic, loop end
    assert theirs == 0  # torch.compile: the frame runs eagerly


def test_loop_over_a_tuple_of_tensors(capsys):
    ws = tuple(torch.randn(3, 3) for _ in range(10))
    ours, theirs = run(over_tensors, torch.randn(2, 3), ws)
    assert ours == 3  # root, one body entry for every item, the loop end


def test_nested_break_in_a_loop(capsys):
    ours, theirs = run(calls_in_loop, torch.randn(3), 15)
    assert ours == 4 and theirs == 2  # torch.compile: only the helper's two graphs


def test_dynamic_loop_counter_in_python_control_flow():
    ours, _ = run(parity, torch.randn(3), 9)
    assert ours == 4


def test_iteration_count_change_reuses_the_body_entries():
    ours = CountingBackend()
    cf = ferrodyn.compile(loop_break, backend=ours)
    x = torch.randn(3)
    for n in (8, 8, 13, 13, 21):
        torch.testing.assert_close(cf(x, n), loop_break(x, n))
    assert ours.count <= 8

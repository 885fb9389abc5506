"""`ferrodyn.config.reorderable_logging_functions` (issue 8), like torch's
`torch._dynamo.config.reorderable_logging_functions`: calls of the listed functions with tensor
or constant arguments are recorded and run after the graph instead of breaking it; empty by
default (print breaks, as in torch.compile). Output and order compared with eager's, graph
counts with torch.compile's under the same setting."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

LOG: list = []


def log(*args, sep=" "):
    LOG.append(sep.join(str(a) for a in args))


def prints(x):
    y = x.sin() + 1
    print("y is", y, 3)
    z = y * 2
    print("done", z.sum().item() > -100)  # .item() (no capture_scalar_outputs): a break
    return z.cos()


def logs(x):
    y = x * 2
    log("first", y)
    y = y + 1
    log("second", y, sep="|")
    return y


def graphs(fn, x, reorder, capsys):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    want = fn(x)
    out_eager = capsys.readouterr().out
    with ferrodyn.config.patch(reorderable_logging_functions=reorder), \
            torch._dynamo.config.patch(reorderable_logging_functions=reorder):
        got = ferrodyn.compile(fn, backend=ours)(x)
        out_ours = capsys.readouterr().out
        torch.compile(fn, backend=theirs)(x)
        capsys.readouterr()
    torch.testing.assert_close(got, want)
    assert out_ours == out_eager
    return ours.count, theirs.count


def test_print_breaks_by_default(capsys):
    ours, theirs = graphs(prints, torch.randn(3), set(), capsys)
    assert ours == theirs == 3


def test_listed_print_is_replayed_after_the_graph_in_order(capsys):
    ours, theirs = graphs(prints, torch.randn(3), {print}, capsys)
    assert ours == theirs == 2  # only the .item() break is left


def test_listed_user_function_is_called_with_the_graphs_values(capsys):
    LOG.clear()
    x = torch.randn(3)
    logs(x)
    want = list(LOG)
    LOG.clear()
    ours, theirs = graphs(logs, x, {log}, capsys)
    assert LOG[-2:] == want and ours == 1
    LOG.clear()


def test_arguments_that_are_not_tensors_or_constants_still_break(capsys):
    def f(x):
        y = x + 1
        print([y])  # a list: not reordered (its later state would be printed)
        return y * 2

    ours, theirs = graphs(f, torch.randn(2), {print}, capsys)
    assert ours == 2 and ours <= theirs


def test_setting_is_checked():
    with pytest.raises(TypeError, match="reorderable_logging_functions"):
        ferrodyn.config.reorderable_logging_functions = {"print"}
    assert ferrodyn.config.reorderable_logging_functions == set()

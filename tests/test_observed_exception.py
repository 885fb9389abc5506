"""An exception the trace raises that no handler of the frame catches (an error of an operation
on a traced value: `None[...]`, a missing dict key) makes the frame run eagerly, as
torch.compile's "observed exception" does; it is never a graph break at the raising
instruction. A break there would run the instruction after a prefix traced with
`torch.compiler.is_compiling()` true, so code that avoids the error only when not compiling
(transformers' `attention_mask is None and not is_torchdynamo_compiling()`) raised where eager
does not. Compiled vs eager (values, exception types), graph counts beside torch.compile's."""

import pytest
import torch

from compiled_vs_eager import run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def mask_made_only_when_not_compiling(x, mask=None):
    y = x.sin()
    if mask is None and not torch.compiler.is_compiling():
        mask = torch.ones(x.shape[0])
    return y * mask[:, None]


class Inner(torch.nn.Module):
    def forward(self, x, mask=None):
        return mask_made_only_when_not_compiling(x, mask)


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        y = x.cos()
        torch._dynamo.graph_break()
        return self.inner(y) + 1


def missing_key_after_tensor_work(x):
    y = x * 2
    table = {"a": y}
    return table["b"]


def caught_in_the_frame(x, mask=None):
    y = x.sin()
    try:
        m = mask[:, None]
    except TypeError:
        m = 2
    return y * m


def test_error_avoided_only_when_not_compiling_runs_the_frame_eagerly():
    want, got, fd, tc = run_all(mask_made_only_when_not_compiling, torch.randn(3, 2))
    assert isinstance(got, torch.Tensor)
    assert fd == tc == 0


def test_in_a_module_called_after_a_graph_break():
    torch.manual_seed(0)
    m = Outer()
    want, got, fd, tc = run_all(m, torch.randn(3, 2))
    assert fd == tc == 1  # the graph before the break; the rest runs eagerly


def test_uncaught_error_raises_as_eager_with_no_graph():
    _, _, fd, tc = run_all(missing_key_after_tensor_work, torch.randn(2))  # KeyError both
    assert fd == tc == 0


def test_error_caught_in_the_frame_stays_one_graph():
    _, _, fd, tc = run_all(caught_in_the_frame, torch.randn(3))
    assert fd == 1 and tc <= fd


def compiling_helper():  # transformers' `is_torchdynamo_compiling`
    return torch.compiler.is_compiling()


def mask_made_by_a_helper_check(x, mask=None):
    y = x.sin()
    if mask is None and not compiling_helper():
        mask = torch.ones(x.shape[0])
    return y * mask[:, None]


def test_helper_reading_is_compiling_called_from_an_eager_frame_runs_eagerly():
    """The frame above runs eagerly (observed exception); the helper it calls is a frame of
    its own with no graph op: compiled, it would return the folded True to eager code."""
    want, got, fd, tc = run_all(mask_made_by_a_helper_check, torch.randn(3, 2))
    assert isinstance(got, torch.Tensor)
    assert fd == tc == 0


def test_helper_inlined_in_a_traced_frame_still_folds():
    def fn(x):
        return x + 1 if compiling_helper() else x - 1
    import ferrodyn
    from counting_backend import CountingBackend
    fd, tc = CountingBackend(), CountingBackend()
    x = torch.zeros(2)
    got = ferrodyn.compile(fn, backend=fd)(x)
    want = torch.compile(fn, backend=tc)(x)
    assert torch.equal(got, want) and torch.equal(got, x + 1)
    assert fd.count == tc.count == 1

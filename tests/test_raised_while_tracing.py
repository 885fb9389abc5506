"""A real operation that raises at trace time on a traced value (an attribute missing on
`None`, an unhashable dict key, a missing module attribute) where the exception is not modelled
as a traced one: uncaught by the traced frames, the frame runs eagerly; never a graph break at
the raising instruction, which would run it after a prefix traced with
`torch.compiler.is_compiling()` true (transformers' LongT5: `attention_mask` made only when not
compiling, then `attention_mask.shape` in a helper two calls down). Under a handler the break
stays (the real handler runs). Compiled vs eager (values, exception types), graph counts beside
torch.compile's."""

import pytest
import torch

from compiled_vs_eager import run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _blocks(mask, n):  # the operation that fails on None, two calls down
    return mask.shape[1] // n


def _local_mask(mask, n):
    return mask.reshape(mask.shape[0], _blocks(mask, n), n)


def stack_forward(x, mask=None):
    y = x.cos()
    if mask is None and not torch.compiler.is_compiling():
        mask = torch.ones(x.shape[0], x.shape[1])
    return y + _local_mask(mask, 2).sum(-1).repeat_interleave(2, -1)


def unhashable_key_when_compiling(x):
    key = [1] if torch.compiler.is_compiling() else 1
    table = {key: x}
    return table[1] * 2


def module_attribute_when_compiling(x):
    name = "no_such_function" if torch.compiler.is_compiling() else "sin"
    return getattr(torch, name)(x) + 1


def caught_attribute_error(x, mask=None):
    y = x.sin()
    try:
        n = mask.shape[0]
    except AttributeError:
        n = 3
    return y * n


def raises_in_eager_too(x):
    y = x + 1
    return y, None.shape


@pytest.mark.parametrize("fn", [stack_forward, unhashable_key_when_compiling,
                                module_attribute_when_compiling])
def test_error_only_in_the_trace_runs_the_frame_eagerly(fn):
    want, got, fd, tc = run_all(fn, torch.randn(3, 4))
    assert isinstance(got, torch.Tensor)
    assert fd <= tc or fd == 0


def test_in_a_module_after_a_graph_break_keeps_eager_values():
    class Stack(torch.nn.Module):
        def forward(self, x, mask=None):
            return stack_forward(x, mask)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stack = Stack()

        def forward(self, x):
            h = x * 2
            torch._dynamo.graph_break()
            return self.stack(h) - 1

    want, got, fd, tc = run_all(Model(), torch.randn(3, 4))
    assert fd <= tc


def test_error_under_a_handler_keeps_the_break_and_eager_values():
    want, got, fd, tc = run_all(caught_attribute_error, torch.randn(3))
    assert torch.equal(got, want)
    assert fd >= 1


def test_error_eager_raises_too_raises_the_same():
    _, _, fd, tc = run_all(raises_in_eager_too, torch.randn(2))  # AttributeError both
    assert fd == tc == 0

"""Callables from torch that a graph cannot name. torch.fx writes a `call_function` node whose
target comes from torch as its qualified name (`torch.<__module__>.<__name__>`), looked up when
the graph runs. A `functools.wraps` wrapper made by torch (`torch.vmap(f)`, `torch.func.grad(f)`)
carries the wrapped function's name: the graph either failed at run time
(`torch._functorch.apis.acos_` does not exist; PyTorch's test/dynamo/test_functions.py
`test_is_vmapped_mutated_tensor_tensor`) or, worse, called the wrapped function instead of the
wrapper (`torch.func.grad(torch.sin)(x)` computed `sin(x)`). Such calls now break the graph and
run eagerly. Each case: results and mutated inputs equal eager's, graph counts against
torch.compile's."""

import copy

import pytest
import torch

import ferrodyn
from compiled_vs_eager import run_all, same
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def grad_of_sin(x):
    return torch.func.grad(torch.sin)(x)


GRAD_COS = torch.func.grad(torch.cos)


def grad_of_global(x):
    return GRAD_COS(x) + 1


def vmap_inplace_is_input(x):
    y = torch.vmap(torch.Tensor.acos_)(x)
    return y is x, y


def vmap_inplace_on_clone(z):
    x = z.clone()
    y = torch.vmap(torch.Tensor.acos_)(x)
    return y is x, y is z, x


def grad_then_more(x):
    a = x.sin()
    g = torch.func.grad(torch.sin)(x)
    return a + g


@pytest.mark.parametrize("fn", [grad_of_sin, grad_of_global])
def test_functorch_wrapper_result_is_eager(fn):
    """The wrapper's own result (cos for grad of sin), never the wrapped function's."""
    _, _, fd, tc = run_all(fn, torch.tensor(0.5))
    assert fd <= tc, (fd, tc)


def test_functorch_wrapper_breaks_between_graphs():
    """Work before the wrapper call stays captured: ferrodyn breaks there (two graphs) where
    torch.compile traces the transform as a higher-order op (one graph)."""
    _, _, fd, tc = run_all(grad_then_more, torch.tensor(0.5))
    assert (fd, tc) == (2, 1), (fd, tc)


@pytest.mark.parametrize("fn", [vmap_inplace_is_input, vmap_inplace_on_clone])
def test_vmap_of_inplace_method(fn):
    """No error from the graph, eager's identities, and the input mutated as eagerly."""
    x = torch.ones(4, 1) * 0.5
    want_x, got_x = x.clone(), x.clone()
    want = fn(want_x)
    counter = CountingBackend()
    got = ferrodyn.compile(fn, backend=counter)(got_x)
    assert same(want, got), (want, got)
    assert torch.equal(want_x, got_x)
    tc = CountingBackend()
    torch._dynamo.reset()
    torch.compile(fn, backend=tc)(x.clone())
    torch._dynamo.reset()
    assert counter.count <= tc.count, (counter.count, tc.count)


def test_nameable_torch_functions_still_captured():
    """Ordinary torch functions (Python functions of torch.nn.functional, builtins of torch,
    Tensor methods) are still graph ops: one graph, as torch.compile."""
    def fn(x):
        return torch.nn.functional.gelu(torch.sin(x)).sum(0) + torch.nn.functional.softmax(x, -1)
    _, _, fd, tc = run_all(fn, torch.randn(3, 3))
    assert fd == tc == 1, (fd, tc)

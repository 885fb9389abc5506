"""`math` functions over lists (`math.prod(self.size)`, `math.fsum(xs)`, `math.hypot(*xs)`): a
math function neither mutates its argument nor returns one of its items, so it folds on the
constant items of a list (a frame argument, a module attribute or a list built in the frame) in
one graph, as torch.compile does; a list changed between calls gives the new value (its items
are guarded). Each case: ferrodyn vs eager, graph count no more than torch.compile's."""

import copy
import math

import pytest
import torch

import ferrodyn
from compiled_vs_eager import check_one_graph_like_torch
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def prod_of_argument_list(x, size):
    return x.reshape(-1, math.prod(size))


def prod_of_list_built_in_frame(x, strides):
    sizes = [x.shape[0]]
    sizes.append(math.prod(strides))
    sizes += [s * 2 for s in strides]
    return x * math.prod(sizes), math.prod(sizes, start=2)


def prod_over_schedule(x, schedule):
    b = 1
    for strides in schedule:  # a list of lists, as timm's Hiera keeps its unroll schedule
        b *= math.prod(strides)
    return x + b


def float_reductions(x, xs):
    return x * math.fsum(xs), x + math.hypot(*xs), x - math.dist(xs, [0.0] * len(xs))


@pytest.mark.parametrize("fn, args", [
    (prod_of_argument_list, (torch.randn(2, 3, 4), [3, 4])),
    (prod_of_list_built_in_frame, (torch.randn(2, 3), [2, 3])),
    (prod_over_schedule, (torch.randn(3), [[2, 2], [1, 3], (2, 1)])),
    (float_reductions, (torch.randn(3), [0.5, 1.5, 2.0])),
], ids=lambda v: getattr(v, "__name__", ""))
def test_math_on_lists_folds_in_one_graph(fn, args):
    check_one_graph_like_torch(fn, *args)


class Unroll(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.size = [4, 2]

    def forward(self, x):
        return x.reshape(-1, math.prod(self.size), x.shape[-1])


def test_module_list_attribute_changed_between_calls():
    x = torch.randn(2, 8, 5)
    m, t = Unroll(), CountingBackend()
    fd = CountingBackend()
    compiled = ferrodyn.compile(copy.deepcopy(m), backend=fd)
    torch.compile(m, backend=t)(x)
    assert torch.equal(compiled(x), m(x))
    assert fd.count == 1 and t.count <= fd.count, (fd.count, t.count)
    for size in ([2, 2], [8, 1]):  # the list mutated in place: the fold must not be stale
        compiled._orig_mod.size[:] = size
        m.size[:] = size
        assert compiled(x).shape == m(x).shape == (2 * 8 // math.prod(size), math.prod(size), 5)
        assert torch.equal(compiled(x), m(x))
    torch._dynamo.reset()

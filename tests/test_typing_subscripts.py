"""Subscripts of `typing` aliases in traced code (`torch.jit.annotate(List[Tensor], [])`, as in
timm's CrossViT; `Dict[str, Optional[Tensor]]`, `Tuple[int, ...]`) fold to the alias objects
CPython makes (variables/typing_vars.py): one graph like torch.compile, results and identities
as eager's, an alias from the frame guarded by identity, and a subscript that raises in eager
raises the same exception compiled. Each case: ferrodyn vs eager, graph counts vs torch.compile's."""

import typing
from typing import Dict, List, Optional, Tuple

import pytest
import torch

import ferrodyn
from compiled_vs_eager import check_one_graph_like_torch, run_all
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def annotate_list_then_append(x):
    out = torch.jit.annotate(List[torch.Tensor], [])
    for i in range(3):
        out.append(x * i)
    return torch.stack(out)


def nested_aliases(x):
    d = torch.jit.annotate(Dict[str, Optional[torch.Tensor]], {})
    d["a"] = x + 1
    d["b"] = None
    return d, Optional[List[int]]


def alias_identity_and_returned(x):
    t = Tuple[int, ...]
    return x - 1, t, t is Tuple[int, ...], Tuple[int, ...] == typing.Tuple[int, ...]


def builtin_generic_of_an_alias(x):
    return x * 2, List[list[int]], typing.Union[int, None] is Optional[int]


@pytest.mark.parametrize("fn", [annotate_list_then_append, nested_aliases,
                                alias_identity_and_returned, builtin_generic_of_an_alias],
                         ids=lambda f: f.__name__)
def test_typing_subscript_folds_in_one_graph(fn):
    check_one_graph_like_torch(fn, torch.randn(3))


def test_subscript_that_raises_in_eager_raises_compiled():
    def f(x):
        y = x + 1
        return y, List[int, str]  # TypeError: too many arguments

    _, _, fd, tc = run_all(f, torch.randn(2))
    assert fd <= tc + 1, (fd, tc)


def test_subscripted_generic_as_isinstance_classinfo_raises():
    def f(x):
        return isinstance(x + 1, List[int])  # TypeError in eager

    run_all(f, torch.randn(2))


def test_alias_from_the_frame_is_guarded_by_identity():
    def f(x, alias):
        return x + 1, alias[int]

    x = torch.randn(2)
    fd = CountingBackend()
    compiled = ferrodyn.compile(f, backend=fd)
    for alias in (List, typing.Set, List):
        got, want = compiled(x, alias), f(x, alias)
        assert torch.equal(got[0], want[0]) and got[1] is want[1], (got, want)
    t = CountingBackend()
    torch.compile(f, backend=t)(x, List)
    torch._dynamo.reset()
    assert fd.count == 2 and t.count == 1, (fd.count, t.count)  # one graph per alias


class Projections(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.projs = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    def forward(self, x):
        outs = torch.jit.annotate(List[torch.Tensor], [])
        for proj in self.projs:
            outs.append(proj(x[:, 0:1, ...]))
        return torch.cat(outs, dim=1)


def test_module_annotating_a_list_of_tensors():
    m, x = Projections(), torch.randn(2, 3, 4)
    fd, t = CountingBackend(), CountingBackend()
    with torch.no_grad():
        want = m(x)
        got = ferrodyn.compile(m, backend=fd)(x)
        torch.compile(m, backend=t)(x)
    torch._dynamo.reset()
    assert torch.equal(got, want)
    assert fd.count == 1 and t.count <= fd.count, (fd.count, t.count)


# `int | None` (a types.UnionType) read from the frame: transformers' config checks call
# typing.get_args on a field's annotation
OPTIONAL_INT = int | None
FIELDS = {"scale": float | None, "n": int}


def union_args_from_a_global(x):
    y = x.sin()  # a graph op before the read: a break at it makes two graphs
    args = typing.get_args(OPTIONAL_INT)
    return y * len(args), args, OPTIONAL_INT.__args__[0] is int, type(None) in args


def union_args_of_annotations(x):
    y = x.cos()
    n = sum(len(typing.get_args(tp)) for tp in FIELDS.values())
    return y + n, FIELDS["scale"].__args__


@pytest.mark.parametrize("fn", [union_args_from_a_global, union_args_of_annotations],
                         ids=lambda f: f.__name__)
def test_union_type_parts_are_constants_in_one_graph(fn):
    check_one_graph_like_torch(fn, torch.randn(3))


def test_union_type_from_the_frame_is_guarded_by_identity():
    def f(x, tp):
        return x + 1, typing.get_args(tp)

    x = torch.randn(2)
    fd = CountingBackend()
    compiled = ferrodyn.compile(f, backend=fd)
    opt = int | None
    for tp in (opt, str | bytes, opt):
        got, want = compiled(x, tp), f(x, tp)
        assert torch.equal(got[0], want[0]) and got[1] == want[1], (got, want)
    assert fd.count == 2, fd.count  # one graph per union object

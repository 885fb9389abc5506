"""An attribute read from the class (a method, a module's `forward`, a class constant, a
staticmethod) must not stay compiled in once the instance's `__dict__` shadows it: the guard tree
checks that the name is still absent from the instance dict (`DICT_LACKS`), as torch.compile's
DICT_CONTAINS guard does. Wrong value before the fix: the compiled code kept calling the class's
method after `obj.f = ...`. Each case compares results with eager after the change, and compile
counts with torch.compile over the same calls."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import ferrodyn
from counting_backend import CountingBackend


class Scaler:
    scale = 2.0

    def f(self, x):
        return x + 1

    @staticmethod
    def s(x):
        return x * 3

    @classmethod
    def c(cls, x):
        return x - cls.scale

    @property
    def p(self):
        return 5.0


def _shadow_method(o):
    o.f = lambda x: x * 10


def _shadow_const(o):
    o.scale = 7.0


def _shadow_static(o):
    o.s = lambda x: x - 100


def _shadow_classmethod(o):
    o.c = lambda x: x / 4


CASES = {
    "method": (lambda o, x: o.f(x), _shadow_method),
    "class constant": (lambda o, x: x * o.scale, _shadow_const),
    "staticmethod": (lambda o, x: o.s(x), _shadow_static),
    "classmethod": (lambda o, x: o.c(x), _shadow_classmethod),
}


def _run(make_obj, body, shadow, compiler):
    """Call body twice, shadow the attribute, call twice more; results and the object's
    state after each call."""
    obj = make_obj()

    def fn(x):
        return body(obj, x)

    c = compiler(fn)
    x = torch.randn(3)
    out = [c(x), c(x)]
    shadow(obj)
    out += [c(x), c(x)]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_shadowed_class_attribute_recompiles(fresh_ferrodyn, case):
    body, shadow = CASES[case]
    torch.manual_seed(0)
    eager = _run(Scaler, body, shadow, lambda f: f)
    fd_b, tc_b = CountingBackend(), CountingBackend()
    torch.manual_seed(0)
    got = _run(Scaler, body, shadow, lambda f: ferrodyn.compile(f, backend=fd_b))
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = _run(Scaler, body, shadow, lambda f: torch.compile(f, backend=tc_b))
    for g, e, r in zip(got, eager, ref):
        assert torch.equal(g, e)
        assert torch.equal(r, e)
    assert fd_b.count == tc_b.count == 2


def test_unrelated_attribute_does_not_recompile(fresh_ferrodyn):
    """Only the name read from the class is guarded: another new attribute changes nothing."""
    obj = Scaler()
    b = CountingBackend()
    c = ferrodyn.compile(lambda x: obj.f(x), backend=b)
    x = torch.randn(3)
    c(x)
    obj.other = 1
    assert torch.equal(c(x), x + 1)
    assert b.count == 1


def test_property_is_not_shadowed_by_instance_dict(fresh_ferrodyn):
    """A data descriptor wins over the instance dict in CPython: a same-named dict entry
    changes nothing, and no recompile is needed."""
    obj = Scaler()
    b = CountingBackend()
    c = ferrodyn.compile(lambda x: x * obj.p, backend=b)
    x = torch.randn(3)
    c(x)
    obj.__dict__["p"] = 100.0
    assert torch.equal(c(x), x * obj.p)
    assert obj.p == 5.0
    assert b.count == 1


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("where", ["submodule", "root"])
def test_module_forward_assigned_on_instance(fresh_ferrodyn, where):
    """`m.layers[1].forward = ...` (or the compiled module's own `forward`) replaces what
    `Module.__call__` runs."""
    torch.manual_seed(0)
    m = Stack()
    x = torch.randn(2, 4)

    def shadow(mod):
        target = mod.layers[1] if where == "submodule" else mod
        target.forward = lambda h: h * 100

    results = {}
    counts = {}
    for name, compiler in (("ferrodyn", ferrodyn.compile), ("torch", torch.compile)):
        torch._dynamo.reset()
        mod = Stack()
        mod.load_state_dict(m.state_dict())
        b = CountingBackend()
        c = compiler(mod, backend=b)
        outs = [c(x)]
        shadow(mod)
        outs.append(c(x))
        outs.append(mod(x))  # eager after the change
        results[name] = outs
        counts[name] = b.count
    for name, (before, after, eager_after) in results.items():
        assert torch.equal(after, eager_after), name
        assert torch.allclose(before, m(x)), name
    assert counts["ferrodyn"] <= counts["torch"]


def test_module_tree_method_shadowed(fresh_ferrodyn):
    """`nn.Module.parameters` is modelled by a table; an instance attribute `parameters`
    replaces it for the next call."""
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 3)
    extra = torch.nn.Parameter(torch.ones(3))

    def fn(x):
        return sum(p.sum() for p in m.parameters()) + x

    b = CountingBackend()
    c = ferrodyn.compile(fn, backend=b)
    x = torch.randn(3)
    assert torch.allclose(c(x), fn(x))
    m.parameters = lambda: iter([extra])
    assert torch.allclose(c(x), fn(x))
    assert torch.allclose(fn(x), x + 3)

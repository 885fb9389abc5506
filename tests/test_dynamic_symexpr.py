"""The native symbolic-shape expression IR (rust/guards/symexpr.rs, through
`GuardBuilder.shape_guard`) against sympy's evaluation of the same expressions: random
expressions built from the functions a ShapeEnv's guards use, turned into prefix tokens the
way `shape_guard_specs` does (`symbolic_shapes.sympy_to_prefix`) and evaluated in Rust."""

from __future__ import annotations

import math

import pytest
import sympy
import torch
from hypothesis import given, settings, strategies as st
from torch.utils._sympy.functions import (CeilToInt, FloorDiv, FloorToInt, IntTrueDiv, Max,
                                          Min, PythonMod)
from torch.utils._sympy.printers import PythonPrinter

from ferrodyn import _C
from ferrodyn.symbolic_shapes import ShapeGuardUnsupported, sympy_to_prefix, to_prefix

A, B, C = SYMS = sympy.symbols("a b c", integer=True)
_I64 = 2 ** 63


def _safe(fn):
    """Build `fn(*args)`; torch's functions refuse some constant arguments at construction
    (they then stand for their first argument)."""
    def make(args):
        try:
            return fn(*args)
        except (AssertionError, ZeroDivisionError, ValueError, TypeError):
            return args[0]
    return make


def _ints():
    leaves = st.one_of(st.sampled_from(SYMS), st.integers(-20, 20).map(sympy.Integer))

    def extend(inner):
        return st.one_of(
            st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
            st.tuples(inner, inner).map(lambda t: t[0] - t[1]),
            st.tuples(inner, inner).map(lambda t: t[0] * t[1]),
            st.tuples(inner, inner).map(_safe(FloorDiv)),
            st.tuples(inner, inner).map(_safe(PythonMod)),
            st.tuples(inner, st.integers(1, 9)).map(_safe(sympy.Mod)),
            st.tuples(inner, inner, inner).map(_safe(Max)),
            st.tuples(inner, inner).map(_safe(Min)),
            st.tuples(inner, st.integers(0, 3)).map(lambda t: t[0] ** t[1]),
            inner.map(lambda e: -e),
        )

    return st.recursive(leaves, extend, max_leaves=6)


def _bools():
    rel = st.tuples(st.sampled_from([sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge]),
                    _ints(), _ints()).map(lambda t: t[0](t[1], t[2]))

    def extend(inner):
        return st.one_of(st.tuples(inner, inner).map(lambda t: sympy.And(*t)),
                         st.tuples(inner, inner).map(lambda t: sympy.Or(*t)),
                         inner.map(sympy.Not))

    return st.recursive(rel, extend, max_leaves=4)


def _native(tokens: str, names: list[str], values: dict[str, int], rhs: int | None = None):
    b = _C.GuardBuilder()
    nodes = {n: b.local(i, n) for i, n in enumerate("abc")}
    if rhs is not None:
        tokens = f"eq {tokens} {rhs}"
    b.shape_guard(tokens, [(nodes[n], "int", 0) for n in names])
    return b.build().check([values["a"], values["b"], values["c"]])


def _sympy_value(expr, values):
    env = {A: values["a"], B: values["b"], C: values["c"]}
    divisions = (FloorDiv, PythonMod, sympy.Mod)
    for sub in sympy.preorder_traversal(expr):  # x // 0 has no Python value: skip the example
        if isinstance(sub, divisions):
            try:
                if sub.args[1].subs(env) == 0:
                    return None
            except (ZeroDivisionError, ValueError, AssertionError):
                return None
    try:
        v = expr.subs(env)
    except (ZeroDivisionError, ValueError, AssertionError):
        return None
    if v in (sympy.true, sympy.false):
        return bool(v)
    if not v.is_Integer:  # zoo / nan from a division by zero
        return None
    return int(v)


VALUES = st.fixed_dictionaries({k: st.integers(-30, 30) for k in "abc"})


@settings(max_examples=80, deadline=None)
@given(_ints(), VALUES)
def test_integer_expressions_match_sympy(expr, values):
    text = str(expr)
    tokens, names = sympy_to_prefix(expr)
    want = _sympy_value(expr, values)
    if want is None or abs(want) >= _I64:  # division by zero / overflow: the guard fails
        assert not _native(tokens, names, values, rhs=0) and not _native(tokens, names, values, rhs=1)
        return
    assert _native(tokens, names, values, rhs=want), (text, values, want)
    assert not _native(tokens, names, values, rhs=want + 1), (text, values, want)


@settings(max_examples=80, deadline=None)
@given(_bools(), VALUES)
def test_boolean_expressions_match_sympy(expr, values):
    text = str(expr)
    tokens, names = sympy_to_prefix(expr)
    want = _sympy_value(expr, values)
    if want is None:  # a division by zero somewhere: sympy has no value; Rust fails closed
        return
    assert _native(tokens, names, values) is want, (text, values)


def test_printed_text_is_not_trusted():
    """torch's printer writes -Mod(a, 2) as `(-1)*a % 2`, i.e. ((-1)*a) % 2 (torch's Mod prints
    the same way): the sympy form is converted instead (a guard built from the text would be
    wrong for odd a)."""
    expr = -sympy.Mod(A, 2)
    assert PythonPrinter().doprint(expr) == "(-1)*a % 2"
    tokens, names = sympy_to_prefix(expr)
    assert _native(tokens, names, {"a": 1, "b": 0, "c": 0}, rhs=-1)


@pytest.mark.parametrize("expr", [A / 2, A + sympy.Rational(1, 2), sympy.floor(A / 3), A * 0.5])
def test_sympy_forms_without_a_native_form_are_refused(expr):
    with pytest.raises(ShapeGuardUnsupported):
        sympy_to_prefix(expr)


@pytest.mark.parametrize("text", ["a / 2", "a + 0.5", "math.floor(a)", "a if b else c", "a in b"])
def test_forms_without_a_native_form_are_refused(text):
    with pytest.raises(ShapeGuardUnsupported):
        to_prefix(text)


@pytest.mark.parametrize("bad", ["", "add:2 s0", "frob 1", "s0 s1", "eq s0 s5"])
def test_malformed_prefix_is_a_value_error(bad):
    b = _C.GuardBuilder()
    with pytest.raises(ValueError, match="shape_guard"):
        b.shape_guard(bad, [(b.local(0, "a"), "int", 0)])


def test_symbol_kinds_read_sizes_strides_and_ints():
    b = _C.GuardBuilder()
    x, n = b.local(0, "x"), b.local(1, "n")
    b.shape_guard("eq mul:2 s0 s1 s2", [(x, "size", 0), (x, "stride", 0), (n, "int", 0)])
    with pytest.raises(ValueError, match="unknown symbol kind"):
        b.shape_guard("eq s0 1", [(x, "numel", 0)])
    tree = b.build()
    assert tree.leaves() == ["L['x'].size()[0] * L['x'].stride()[0] == L['n']"]
    assert tree.check([torch.randn(3, 4), 12])
    assert not tree.check([torch.randn(3, 5), 12])
    assert not tree.check([torch.randn(3, 4), 12.0])  # not an int: cannot be read
    assert not tree.check([[1, 2], 12])  # not a tensor
    assert tree.explain([torch.randn(3, 5), 12]) == (
        "L['x'].size()[0] * L['x'].stride()[0] == L['n'] "
        "(got L['x'].size()[0] = 3, L['x'].stride()[0] = 5, L['n'] = 12)")
    assert tree.explain([torch.randn(3, 4), "12"]).endswith("(L['n'] could not be read)")


_ROUNDED = [(CeilToInt, math.ceil), (FloorToInt, math.floor)]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(_ROUNDED), st.integers(-(2 ** 60), 2 ** 60) | st.integers(-40, 40),
       st.integers(-9, 9).filter(bool), st.integers(-3, 3))
def test_ceil_floor_of_true_division_match_python(kind, a, d, delta):
    """math.ceil(s / d) / math.floor(s / d) (CeilToInt/FloorToInt(IntTrueDiv)) are exact integer
    divisions in the IR with the numerator bounded by 2**52, where Python's float division
    gives the same value; outside the bound the guard fails (a miss, never a wrong hit)."""
    sym_fn, py_fn = kind
    expr = sympy.Eq(sym_fn(IntTrueDiv(A, sympy.Integer(d))), B)
    tokens, names = sympy_to_prefix(expr)
    b = py_fn(a / d) + delta
    got = _native(tokens, names, {"a": a, "b": b, "c": 0})
    if abs(a) < 2 ** 52:
        assert got is (delta == 0), (a, d, b)
    else:
        assert got is False

"""The converter on CPython 3.13's new and changed bytecode, through `ferrodyn.compile`.

Each case is ordinary source that 3.13 compiles to the opcodes it adds or changes (CALL_KW,
TO_BOOL, COMPARE_OP's bool bit, LOAD_FAST_LOAD_FAST, STORE_FAST_STORE_FAST,
STORE_FAST_LOAD_FAST, MAKE_FUNCTION + SET_FUNCTION_ATTRIBUTE, LOAD_FAST of a cell,
CONVERT_VALUE, FORMAT_SIMPLE, FORMAT_WITH_SPEC, the NULL/self slot above the callable, FOR_ITER
skipping END_FOR + POP_TOP, LOAD_SUPER_ATTR, and a cell slot saved and restored around an
inlined comprehension); on 3.11 and 3.12 the same source exercises their older forms. Every
case: compiled == eager on the same inputs, one graph, and the same graph count as
torch.compile. On 3.13 the cases are checked to contain every opcode listed.
"""

import dis
import sys
import types

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from ferrodyn import _C
from ferrodyn.symbolic.registry import handled_names

VERSION = sys.version_info[:2]


def scaled(x, *, scale=1.0, shift=0.0):
    return x * scale + shift


def call_kw(x, w):
    return torch.clamp(x, min=-0.5, max=w) + scaled(x, scale=2.0, shift=w)


def methods_and_globals(x):
    return x.sum(dim=0).relu() + torch.relu(x).mean()


def to_bool(x, flag, n, items):
    if flag:
        x = x + 1
    if not items:
        x = x * 3
    if n == 2:
        x = x - 1
    y = x * 2 if n else x
    return y, not flag, n == 2, bool(items) and n > 1


def superinstructions(x, y):
    a, b = x, y
    c = a + 1; d = c
    for i in range(3):
        b = b + i
    return a + b, d


def nested_functions(x, k):
    def affine(v, w=2.0, *, bias=0.5):
        return v * w + bias + k

    def twice(v):
        return affine(affine(v))

    sq = lambda v, p=2: v ** p  # noqa: E731
    return twice(x), sq(x), affine(x, 3.0, bias=k)


def fstrings(x, n, name):
    label = f"{name!r:>8}|{n:03d}|{name}|{n!s}|{name!a}"
    return x + n, label


def star_calls(x, parts, opts):
    ys = torch.cat([*parts, x])
    return scaled(x, **opts) + ys.sum(), torch.stack(parts), x.new_zeros(*x.shape)


def loops_and_comprehensions(x, xs):
    acc = x
    for t in xs:
        acc = acc + t
    squares = [t * t for t in xs]
    total = sum(t.sum() for t in xs)
    pairs = {i: t for i, t in enumerate(xs)}
    return acc, squares, total, pairs[1]


def comprehension_shadows_cell(x):
    """The comprehension's `i` reuses the slot of the outer `i`, a cell (captured by g): the
    slot holds the cell, then plain values, then the cell again."""
    i = 10
    g = lambda: i  # noqa: E731
    ys = [x * i for i in range(3)]
    return x + i, g(), ys[2]


def comprehension_cell_shadows_cell(x):
    """As above, with the comprehension's `i` a cell of its own (captured by the lambdas)."""
    i = 10
    g = lambda: i  # noqa: E731
    fs = [lambda: x * i for i in range(3)]
    return x + i, g(), fs[0](), fs[2]()


class Base(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class Child(Base):
    def forward(self, x):
        return super().forward(x).relu() + super().forward(x * 2)


def super_calls(m, x):
    return m(x)


def t(*shape):
    return torch.randn(*shape)


CASES = [
    (call_kw, lambda: (t(4), 0.25), {"CALL_KW"}),
    (methods_and_globals, lambda: (t(3, 4),), {"LOAD_ATTR", "LOAD_GLOBAL", "CALL"}),
    (to_bool, lambda: (t(3), True, 2, [1]), {"TO_BOOL", "COMPARE_OP"}),
    (to_bool, lambda: (t(3), False, 0, []), {"TO_BOOL"}),
    (superinstructions, lambda: (t(3), t(3)),
     {"LOAD_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "STORE_FAST_LOAD_FAST"}),
    (nested_functions, lambda: (t(3), 0.5), {"MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE"}),
    (fstrings, lambda: (t(2), 7, "abc"), {"CONVERT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC"}),
    (star_calls, lambda: (t(3), [t(3), t(3)], {"scale": 3.0}), {"CALL_FUNCTION_EX"}),
    (loops_and_comprehensions, lambda: (t(3), [t(3), t(3), t(3)]), {"FOR_ITER", "END_FOR"}),
    (super_calls, lambda: (Child(), t(2, 4)), {"LOAD_SUPER_ATTR"}),
    (comprehension_shadows_cell, lambda: (t(2),), {"LOAD_FAST_AND_CLEAR", "MAKE_CELL"}),
    (comprehension_cell_shadows_cell, lambda: (t(2),), {"LOAD_FAST_AND_CLEAR", "MAKE_CELL"}),
]
IDS = [f"{fn.__name__}-{i}" for i, (fn, _, _) in enumerate(CASES)]


def opnames(fn) -> set[str]:
    """Opcodes of `fn`'s code and every code object nested in it (and, for the module case,
    of the methods it reaches)."""
    codes = [fn.__code__] + ([Child.forward.__code__] if fn is super_calls else [])
    names = set()
    while codes:
        code = codes.pop()
        names |= {i.opname for i in dis.get_instructions(code)}
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return names


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("fn,make_args,new_in_313", CASES, ids=IDS)
def test_case_matches_eager_and_torch_compile(fresh_ferrodyn, fn, make_args, new_in_313):
    torch.manual_seed(0)
    args = make_args()
    want = fn(*args)
    ours, theirs = CountingBackend(), CountingBackend()
    got = ferrodyn.compile(fn, backend=ours)(*args)
    again = ferrodyn.compile(fn, backend=ours)(*args)
    torch._dynamo.reset()
    ref = torch.compile(fn, backend=theirs)(*args)
    torch._dynamo.reset()
    assert same(got, want), (got, want)
    assert same(again, want)
    assert same(ref, want)
    assert ours.count == theirs.count == 1
    assert _C.cache_entries(fn.__code__)[0].hits >= 1


# Handlers of comprehension cleanup: in the bytecode, never run while tracing (nothing raises).
EXCEPTION_PATHS = {"RERAISE", "PUSH_EXC_INFO", "POP_EXCEPT", "CHECK_EXC_MATCH"}


@pytest.mark.parametrize("fn,make_args,new_in_313", CASES, ids=IDS)
def test_case_bytecode_is_handled(fn, make_args, new_in_313):
    """Every opcode a case runs has a handler on this version, and on 3.13 the case contains
    the 3.13 opcodes it is there for."""
    names = opnames(fn)
    assert not names - handled_names() - EXCEPTION_PATHS
    if VERSION >= (3, 13):
        assert new_in_313 <= names, new_in_313 - names


def test_every_new_313_opcode_has_a_case():
    new = {"CALL_KW", "TO_BOOL", "LOAD_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST",
           "STORE_FAST_LOAD_FAST", "SET_FUNCTION_ATTRIBUTE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC",
           "CONVERT_VALUE"}
    covered = set().union(*(c[2] for c in CASES))
    assert new <= covered
    if VERSION >= (3, 13):
        assert new <= set(dis.opmap)
        assert new <= handled_names()
        assert not ({"KW_NAMES", "FORMAT_VALUE"} & handled_names())


def test_guard_tree_reads_a_frame_locals_proxy():
    """PEP 667: on 3.13 `frame.f_locals` of a function is a FrameLocalsProxy (a dict before);
    a guard tree checked against it reads the locals through the mapping protocol."""
    b = _C.GuardBuilder()
    b.type_is(b.local(0, "x"), int)
    tree = b.build()

    def check(x):
        locals_view = sys._getframe().f_locals
        return type(locals_view).__name__, tree.check(locals_view)

    kind, ok = check(1)
    assert ok and not check("a")[1]
    assert kind == ("FrameLocalsProxy" if VERSION >= (3, 13) else "dict")

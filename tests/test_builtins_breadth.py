"""Builtins and standard-library constructs of model code captured with CPython's semantics:
namedtuple classes made in the frame (variables/namedtuple_vars.py), user classes with `__new__`
and `object.__new__` (variables/dunder_new.py), iterating a tensor or range through
`__iter__()`, Python scalar types as dtypes (`x.to(bool)`), `torch.jit.annotate`.
Each case: ferrodyn vs eager (results and state after every call, which objects are the same
included) and graph counts no more than torch.compile's."""

import textwrap

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from side_effects_harness import differential

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

PRELUDE = """
import collections
from typing import Any
LOG = []
"""

CASES = {
    # ---- collections.namedtuple called in the frame
    "namedtuple_made_in_frame": """
        def f(a, b):
            mytuple = collections.namedtuple("mytuple", ["x", "y", "xy"])
            tmp = mytuple(a, b, a + b)
            return mytuple(tmp.x, tmp[1], tmp.xy + b)
    """,
    "namedtuple_defaults_kwargs_replace_asdict": """
        def f(a, b):
            P = collections.namedtuple("P", "x y xy", defaults=(None, 1, None))
            t = P(a, xy=b)
            return P(t.x, t[1], t.xy + b), t._replace(y=a * 2), t._asdict(), P._fields, \
                P._field_defaults, len(t)
    """,
    "namedtuple_rename_and_make": """
        def f(a, b):
            P = collections.namedtuple("P", ["x", "def", "x"], rename=True)
            t = P._make([a, b, a - b])
            return t, P._fields, isinstance(t, P), isinstance(t, tuple)
    """,
    "namedtuple_class_escapes_with_its_instances": """
        def f(a, b):
            P = collections.namedtuple("P", ["x", "y"])
            t, u = P(a + 1, b), [P(b, a)]
            return t, u, type(t) is P is type(u[0]), P.__module__ == __name__, P.__name__
    """,
    # ---- __new__
    "user_new_then_init": """
        class Mock:
            def __new__(cls):
                return super().__new__(cls)
            def __init__(self):
                self.c = 5
        def f(a, b):
            m = Mock()
            return a * m.c + b, type(m).__name__, vars(m)
    """,
    "new_returning_other_class_skips_init": """
        class Foo:
            def __new__(cls):
                inst = object.__new__(cls)
                inst.a = 3
                return inst
            def __init__(self):
                self.a = 5
        class Bar:
            def __new__(cls):
                inst = object.__new__(Foo)
                inst.a = 7
                return inst
            def __init__(self):
                self.a = 11
        def f(a, b):
            x, y = Bar(), Foo()
            return a * x.a + b * y.a, type(x).__name__, type(y).__name__
    """,
    "new_with_args_and_super_chain": """
        class Vehicle:
            def __new__(cls, *args, **kwargs):
                LOG.append(("new", cls.__name__, len(args), sorted(kwargs)))
                return super(Vehicle, cls).__new__(cls)
            def __init__(self, make, year):
                self.make, self.year = make, year
        class Car(Vehicle):
            def __new__(cls, *args, **kwargs):
                return super(Car, cls).__new__(cls, *args, **kwargs)
            def __init__(self, make, year, doors):
                super().__init__(make, year)
                self.doors = doors
        def f(a, b):
            c = Car("T", 2022, doors=4)
            return a * c.doors + c.year, c.make, isinstance(c, Vehicle)
    """,
    "new_returns_a_cached_object_init_reruns": """
        class Single:
            _inst = None
            def __new__(cls, v):
                if cls._inst is None:
                    cls._inst = object.__new__(cls)
                return cls._inst
            def __init__(self, v):
                LOG.append(v)
                self.v = v
        Single._inst = Single(0)
        def f(a, b):
            s = Single(3)
            return a + s.v, s is Single._inst
    """,
    # ---- min/max over constants: which argument object is returned
    "minmax_ties_return_the_first": """
        def f(a, b):
            r = (max(1, 1.0), max(1.0, 1), min(2, 2.0), min(2.0, 2), max([3, 3.0], key=int),
                 min([(1, "a"), (1, "b")], key=lambda p: p[0]), max((), default=None),
                 max("ab", "b"), max(True, 1), min(0, False))
            return a * len(r) + b, [(type(v).__name__, v) for v in r]
    """,
    # ---- iteration through __iter__()
    "tensor_dunder_iter_rows_are_views": """
        def f(a, b):
            it = a.__iter__()
            for y in it:
                y.add_(1.0)
            return y, a
    """,
    "range_dunder_iter_and_next": """
        def f(a, b):
            it = range(3).__iter__()
            first = next(it)
            return a + first, list(it), next(it, "end")
    """,
    # ---- Python scalar types as dtypes, annotate
    "to_python_scalar_types": """
        def f(a, b):
            r = (a * 5).to(bool).to(float).to(int) + 8
            return r, a.to(complex), torch.zeros(2, dtype=float), b.new_ones(2, dtype=int)
    """,
    "jit_annotate_is_identity": """
        def f(a, b):
            y = torch.jit.annotate(Any, a + 1)
            z = torch.jit.annotate(list, [b])
            return y + 2, z
    """,
}


def _args(g):
    return (torch.linspace(-1.0, 2.0, 6).reshape(3, 2), torch.arange(2.0))


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_in_one_graph(name):
    src = PRELUDE + textwrap.dedent(CASES[name])
    out = differential(src, "f", _args, state=lambda g: list(g["LOG"]),
                       compare_torch_count=False)
    ours, theirs = out["ferrodyn"][1], out["torch"][1]
    assert ours == 1, f"{name}: ferrodyn {ours} graphs"
    assert ours <= theirs, f"{name}: ferrodyn {ours} graphs, torch.compile {theirs}"


def test_namedtuple_made_in_frame_is_a_new_class_per_call():
    """Eagerly each call makes a new class: so does the compiled entry (the trace-time class
    never leaves the trace), with the calling module as `__module__`."""
    import collections

    made = {"last": None}

    def f(a):
        P = collections.namedtuple("P", ["x"])
        made["last"] = P
        return P(a + 1)
    cb = CountingBackend()
    g = ferrodyn.compile(f, backend=cb)
    r1 = g(torch.ones(1))
    assert type(r1) is made["last"]
    r2 = g(torch.ones(1))
    assert type(r2) is made["last"]
    e1, e2 = f(torch.ones(1)), f(torch.ones(1))
    assert cb.count == 1
    assert (type(r1) is type(r2)) == (type(e1) is type(e2)) == False  # noqa: E712
    assert type(r1).__module__ == type(e1).__module__ == __name__
    assert r1._fields == e1._fields and torch.equal(r1.x, e1.x)


@pytest.mark.parametrize("body, exc", [
    ("collections.namedtuple('P', ['x', 'x'])", ValueError),
    ("collections.namedtuple('P', ['1x'])", ValueError),
    ("Plain(1)", TypeError),
    ("object.__new__(WithNew, 1)", TypeError),
    ("object.__new__(3)", TypeError),
])
def test_invalid_construction_raises_eagers_error(body, exc):
    src = textwrap.dedent(f"""
        import collections
        class Plain:
            pass
        class WithNew:
            def __new__(cls):
                return object.__new__(cls)
        def f(x):
            return x + 1, {body}
    """)
    g: dict = {}
    exec(src, g)
    with pytest.raises(exc):
        g["f"](torch.ones(1))
    with pytest.raises(exc):
        ferrodyn.compile(g["f"], backend=CountingBackend())(torch.ones(1))


def test_python_float_is_float64_not_the_default_dtype():
    """`x.to(float)` is float64 whatever the default dtype (torch's argument parser)."""
    def f(x):
        return x.to(float) + 1
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        want = f(torch.ones(2, dtype=torch.float32))
    finally:
        torch.set_default_dtype(old)
    got = ferrodyn.compile(f, backend=CountingBackend())(torch.ones(2, dtype=torch.float32))
    assert got.dtype == want.dtype == torch.float64 and torch.equal(got, want)


@pytest.mark.parametrize("call", [
    "isinstance(x, torch.Tensor, invalid=True)",
    "isinstance(obj=x, class_or_tuple=torch.Tensor)",
    "len(obj=[1, 2])",
    "getattr(x, name='shape')",
    "abs(x=-1)",
    "sum([1, 2], 0, 5)",
    "list(iterable=[1])",
    "itertools.cycle(iterable=[1])",
])
def test_builtin_called_with_arguments_cpython_rejects_raises(call):
    """A builtin called with keywords it does not take, or too many arguments, raises eager's
    TypeError (the handlers' Python signatures are looser: such a call was folded to a value)."""
    g: dict = {"torch": torch}
    exec(f"import itertools\ndef f(x):\n    x = x.sin()\n    return x, {call}", g)
    with pytest.raises(TypeError) as want:
        g["f"](torch.ones(1))
    with pytest.raises(TypeError) as got:
        ferrodyn.compile(g["f"], backend=CountingBackend())(torch.ones(1))
    assert str(got.value) == str(want.value)


def test_builtin_keywords_cpython_accepts_still_compile():
    def f(x):
        a = sorted([3, 1, 2], key=lambda v: -v, reverse=True)
        b = list(enumerate(iterable="ab", start=1))
        c = max([1, 5], default=0, key=lambda v: -v)
        d = list(zip([1], [2], strict=True))
        e = int("11", base=2)
        return x + a[0] + c + e, a, b, d
    cb = CountingBackend()
    got = ferrodyn.compile(f, backend=cb)(torch.ones(1))
    want = f(torch.ones(1))
    assert cb.count == 1
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:]


class _Scaled(__import__("typing").NamedTuple):
    a: torch.Tensor
    b: torch.Tensor

    def __getitem__(self, i):
        return 5 * tuple.__getitem__(self, i)

    def __len__(self):
        return 7

    def __iter__(self):
        return iter((self.b, self.a))

    def __contains__(self, v):
        return v == "magic"


def test_namedtuple_input_with_user_dunders_runs_them():
    """A namedtuple class overriding `__getitem__`/`__iter__`/`__len__`/`__contains__`: the
    overrides run, as eagerly (they were skipped, a wrong value; and the entry read the graph
    inputs through `t[i]`, i.e. through the override: an interpreter crash). The fields are
    read from their slots."""
    def f(t):
        x, y = t
        return t[0] + 1, t.a - 1, len(t), x - y, "magic" in t, 3 in t, [v * 2 for v in t]
    cb = CountingBackend()
    g = ferrodyn.compile(f, backend=cb)
    for t in (_Scaled(torch.ones(2), torch.zeros(2)), _Scaled(torch.zeros(2), torch.ones(2))):
        want, got = f(t), g(t)
        assert len(got) == len(want)
        for w, o in zip(want, got):
            if isinstance(w, list):
                assert all(torch.equal(a, b) for a, b in zip(w, o))
            else:
                assert (torch.equal(w, o) if isinstance(w, torch.Tensor) else w == o)
    assert cb.count == 1


def test_max_with_a_tensor_breaks_with_a_reason_and_matches_eager():
    """`max(t, 0)` returns the tensor object or the int 0 depending on t's data: ferrodyn
    does not turn it into a tensor op (torch.compile's clamp returns a new tensor in both cases
    and splits gradients on ties); it breaks the graph (fullgraph: Unsupported says why)."""
    def f(a, b):
        s = a.sum()
        return max(s, 0), min(1, s), max(a.sum(), b.sum()) + 1
    for a, b in ((torch.ones(2), -torch.ones(2)), (-torch.ones(2), torch.zeros(2))):
        want, got = f(a, b), ferrodyn.compile(f, backend=CountingBackend())(a, b)
        assert [type(w) for w in want] == [type(g) for g in got]
        assert all(bool(torch.as_tensor(w == g).all()) for w, g in zip(want, got))
    with pytest.raises(ferrodyn.Unsupported, match="compares greater"):
        ferrodyn.compile(f, backend=CountingBackend(), fullgraph=True)(torch.ones(2), torch.ones(2))


@pytest.mark.parametrize("flag", ["torch.backends.cuda.matmul.allow_tf32",
                                  "torch.backends.cudnn.allow_tf32",
                                  "torch.backends.cudnn.enabled"])
def test_torch_backend_flags_read_in_the_frame_are_guarded(flag):
    """A torch flag read in the frame decides a branch: flipping it recompiles (cudnn's flags
    were read through an unsourced submodule and folded without a guard: the stale branch ran,
    a wrong value; cuBLAS's were not traced at all: the frame ran eagerly)."""
    g: dict = {"torch": torch}
    exec(f"def f(x):\n    if {flag}:\n        return x.sin() + 1\n    return x.cos() - 1", g)
    f = g["f"]
    cb = CountingBackend()
    c = ferrodyn.compile(f, backend=cb)
    owner, name = flag.rsplit(".", 1)
    obj = eval(owner, g)
    old = getattr(obj, name)
    counts = []
    try:
        for value in (old, not old, old):
            setattr(obj, name, value)
            x = torch.ones(2)
            assert torch.equal(c(x), f(x)), f"{flag}={value}"
            counts.append(cb.count)
    finally:
        setattr(obj, name, old)
    assert counts == [1, 2, 2]  # the flip recompiles once; flipping back hits the first entry

    torch._dynamo.reset()
    tcb = CountingBackend()
    torch.compile(f, backend=tcb)(torch.ones(2))
    assert counts[0] <= tcb.count

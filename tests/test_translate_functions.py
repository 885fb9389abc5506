"""User functions, lambdas, closures, nested functions, defaults, keyword and variadic
arguments, methods of user classes, namedtuples and dataclasses: inlined into one graph."""

import collections
import dataclasses
import functools

import pytest
import torch

from translate_harness import check, count_ops, trace

Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Box:
    lo: torch.Tensor
    hi: torch.Tensor
    scale: float = 1.0

    def width(self):
        return (self.hi - self.lo) * self.scale


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    n: int = 2


def helper(x, k=2, *, shift=0.5):
    return x * k + shift


def variadic(*args, **kwargs):
    total = sum(args)
    for k in sorted(kwargs):
        total = total + kwargs[k]
    return total


def recursive(x, n):
    if n == 0:
        return x
    return recursive(x + 1, n - 1)


class Scaler:
    factor = 3

    def __init__(self, w):
        self.w = w

    def apply(self, x):
        return x * self.w * self.factor

    @staticmethod
    def twice(x):
        return x * 2

    @classmethod
    def make(cls, w):
        return cls(w)

    @property
    def neg(self):
        return -self.w


class SubScaler(Scaler):
    def apply(self, x):
        return super().apply(x) + 1


def f_calls(x, y):
    a = helper(x)
    b = helper(x, 3, shift=1.0)
    c = helper(k=4, x=y)
    d = variadic(x, y, 1, z=y, w=2)
    args = (x, 2)
    kw = {"shift": 0.0}
    e = helper(*args, **kw)
    return a, b, c, d, e, recursive(x, 3)


def f_lambdas_closures(x, n):
    sq = lambda v: v * v  # noqa: E731
    offset = n + 1

    def add_offset(v, extra=1):
        return v + offset + extra

    def make_adder(k):
        def adder(v):
            return v + k
        return adder

    counter = 0

    def bump():
        nonlocal counter
        counter += 1
        return counter

    bump()
    bump()
    add5 = make_adder(5)
    p = functools.reduce(lambda a, b: a + b, [1, 2, 3]) if False else 6
    return sq(x), add_offset(x), add5(x), list(map(lambda v: v * 2, [1, 2])), counter, p


def f_user_classes(x, obj):
    s = Scaler(x)
    t = Scaler.make(2.0)
    u = SubScaler(x)
    return (s.apply(x), t.apply(x), Scaler.twice(x), s.neg, u.apply(x), obj.apply(x),
            obj.neg, obj.w.shape)


def f_namedtuple_dataclass(p, box, fz):
    q = Point(p.x + 1, y=p.y)
    a, b = q
    r = q._replace(x=a * 2) if False else Point(a * 2, b)
    nb = Box(box.lo - 1, box.hi + 1)
    nf = Frozen(fz.a * fz.n)
    return q, r, nb, nb.width(), box.width(), nf, fz.n, q.x + q[1]


GLOBAL_SCALE = 2.5


def f_global_function_closure(x):
    return helper(x) * GLOBAL_SCALE


@pytest.mark.parametrize("fn,args", [
    (f_calls, (torch.randn(3), torch.randn(3))),
    (f_lambdas_closures, (torch.randn(3), 2)),
    (f_user_classes, (torch.randn(3), Scaler(torch.randn(3)))),
    (f_namedtuple_dataclass, (Point(torch.randn(2), torch.randn(2)),
                              Box(torch.zeros(2), torch.ones(2), 2.0), Frozen(torch.ones(2)))),
    (f_global_function_closure, (torch.randn(3),)),
])
def test_functions_inlined(fn, args):
    r = check(fn, *args)
    # no call of a user function is left in the graph: everything was inlined
    targets = {getattr(n.target, "__module__", None) for n in r.graph.graph.nodes
               if n.op == "call_function"}
    assert __name__ not in targets


def test_closure_of_frame_reads_cell():
    k = torch.randn(3)
    m = 4

    def f(x):
        return x + k * m
    r = check(f, torch.randn(3))
    assert any(s.name() == "C['k']" for s in r.graph_inputs)
    assert any(g.source is not None and g.source.name() == "C['m']" for g in r.guards)


def test_global_function_is_id_guarded():
    r = trace(f_global_function_closure, torch.randn(3))
    from ferrodyn.guard_spec import GuardKind
    assert any(g.kind is GuardKind.ID_MATCH and g.source.name() == "G['helper']"
               for g in r.guards)


def test_bound_method_as_frame_function():
    s = Scaler(torch.randn(3))
    m = s.apply
    x = torch.randn(3)
    r = trace(Scaler.apply, s, x)
    from translate_harness import run_traced
    torch.testing.assert_close(run_traced(r, Scaler.apply, s, x), m(x))


@dataclasses.dataclass
class Doubled:
    a: torch.Tensor
    k: int = 1

    def __post_init__(self):
        self.k = self.k * 2


class Plain:
    def __init__(self, t):
        self.t = t * 2
        self.tag = "p"


def f_returns_new_objects(x):
    return Doubled(x, 3), Plain(x), [Point(x, 1)]


def test_objects_created_in_frame_are_rebuilt_without_rerunning_init():
    r = check(f_returns_new_objects, torch.randn(2))
    from translate_harness import run_traced
    d, p, pts = run_traced(r, f_returns_new_objects, torch.ones(2))
    assert d.k == 6  # __post_init__ ran once (traced), not again on rebuild
    assert type(p) is Plain and p.tag == "p"
    torch.testing.assert_close(p.t, torch.full((2,), 2.0))
    assert type(pts[0]) is Point


def scaled(x, k, shift=0.0):
    return x * k + shift


def f_partials(x, p, opaque):
    q = functools.partial(scaled, k=3)
    return p(x), q(x, shift=1.0), opaque


def test_partials_and_opaque_passthrough():
    r = check(f_partials, torch.randn(3), functools.partial(scaled, 2.0), {1, 2})
    from ferrodyn.trace_result import OutSource
    assert isinstance(r.output.items[2], OutSource)


def test_opaque_value_use_is_refused():
    from ferrodyn.exc import Unsupported

    def f(x, s):
        return x + len(s)
    with pytest.raises(Unsupported):
        trace(f, torch.randn(2), memoryview(b"ab"))  # a type the converter does not model

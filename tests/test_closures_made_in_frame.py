"""Functions, closures and functools.partial objects made inside the compiled frame, as the
compiled code hands them out: returned, stored into outside objects, live across a graph
break, then called afterwards (variables/functions.py: NestedFunctionVariable, CellVariable;
variables/functools_vars.py: PartialVariable). Each test runs the function eagerly, under
ferrodyn.compile (a first call that captures, a second that hits) and under torch.compile,
compares what the caller observes afterwards (results, the returned functions called, their
attributes, cell sharing, mutated objects) and the graph counts."""

import functools
import types

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Box:
    """An outside object the compiled function stores into."""


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def run_all(fn, observe, make_args):
    """(ferrodyn graphs, torch.compile graphs) after two calls each; asserts that what
    `observe(result, *args)` sees after each compiled call equals what it sees after eager."""
    torch.manual_seed(0)
    want = observe(fn(*make_args()), *make_args())
    torch._dynamo.reset()
    theirs = CountingBackend()
    ct = torch.compile(fn, backend=theirs)
    for _ in range(2):
        ct(*make_args())
    ours = CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    counts = []
    for _ in range(2):
        args = make_args()
        got = observe(cf(*args), *args)
        assert same(want, got), (want, got)
        counts.append(ours.count)
    assert counts[0] == counts[1], counts  # the second call hits
    return ours.count, theirs.count


def x3():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(3, generator=g),)


# ---- functions made in the frame, returned ---------------------------------------------------

def returns_closure(x):
    y = x + 1

    def g(a: torch.Tensor, b=2, *, c=3) -> torch.Tensor:
        return a * y + b + c
    return g


def observe_function(g, x):
    return [g(x), g(x, 5, c=1), g.__name__, g.__qualname__, g.__module__, g.__defaults__,
            g.__kwdefaults__, dict(g.__annotations__), g.__globals__ is globals(),
            g.__code__.co_name, len(g.__closure__), dict(g.__dict__)]


def test_returned_closure_has_its_attributes_and_runs_afterwards():
    assert run_all(returns_closure, observe_function, x3) == (1, 1)


def two_closures_one_cell(x):
    y = x + 1

    def get():
        return y

    def put(v):
        nonlocal y
        y = v
    return get, put


def observe_shared_cell(r, x):
    get, put = r
    before = get()
    put(x * 7)  # a write through one closure is seen through the other
    return [before, get(), get.__closure__[0] is put.__closure__[0]]


def test_two_returned_closures_share_one_cell():
    assert run_all(two_closures_one_cell, observe_shared_cell, x3) == (1, 1)


def cell_written_after_def(x):
    y = x

    def g():
        return y
    y = x * 2  # the closure sees the cell's last contents
    return g, x.sin()


def test_cell_contents_are_the_last_store_before_return():
    assert run_all(cell_written_after_def, lambda r, x: [r[0](), r[1]], x3) == (1, 1)


def cell_never_bound(x):
    def g():
        return z  # noqa: F821 (a cell never bound: NameError when called)
    if x.numel() < 0:
        z = 1  # noqa: F841
    return g, x + 1


def observe_unbound(r, x):
    try:
        r[0]()
    except NameError as e:
        return [type(e).__name__, r[1]]
    return ["no error", r[1]]


def test_returned_closure_over_an_empty_cell_raises_nameerror():
    ours, _ = run_all(cell_never_bound, observe_unbound, x3)
    assert ours == 1


def lambda_with_tensor_default(x):
    f = lambda a, k=x * 3: a + k  # noqa: E731
    return f, x.cos()


def test_lambda_default_computed_in_the_frame():
    assert run_all(lambda_with_tensor_default,
                   lambda r, x: [r[0](x), r[0].__defaults__, r[0].__name__, r[1]], x3) == (1, 1)


def make_outer():
    k = torch.ones(3)

    def root(x):
        def g():
            return x + k
        return g, x * 2
    return root


ROOT = make_outer()


def test_closure_over_the_frames_own_free_variable_gets_that_cell():
    def observe(r, x):
        g = r[0]
        names = g.__code__.co_freevars
        k_cell = g.__closure__[names.index("k")]
        return [g(), r[1], k_cell is ROOT.__closure__[0]]
    assert run_all(ROOT, observe, x3) == (1, 1)


# ---- stored into outside objects ------------------------------------------------------------

def stores_functions(x, box, lst):
    y = x.cos()
    box.fn = lambda: y * 2
    lst.append(lambda t: t + y)
    return x + 1


def test_functions_stored_into_outside_objects():
    def args():
        return (*x3(), Box(), [])

    torch.manual_seed(0)
    x, box, lst = args()
    want = [stores_functions(x, box, lst), box.fn(), lst[0](x)]
    cf = ferrodyn.compile(stores_functions, backend=(ours := CountingBackend()))
    for _ in range(2):
        x, box, lst = args()
        r = cf(x, box, lst)
        assert same(want, [r, box.fn(), lst[0](x)])
    torch._dynamo.reset()
    ct = torch.compile(stores_functions, backend=(theirs := CountingBackend()))
    ct(*args())
    assert ours.count == 1 and ours.count <= theirs.count


# ---- live across a graph break ----------------------------------------------------------------

def closure_across_break(x):
    y = x + 1

    def g(t):
        return t * y

    def h(v):
        nonlocal y
        y = v
    print("break")
    z = g(x)
    h(x * 5)  # written after the break, through the other closure
    return g, h, z


def observe_across_break(r, x):
    g, h, z = r
    first = g(x)
    h(x)
    return [z, first, g(x), g.__closure__[0] is h.__closure__[0], g.__qualname__]


def test_closures_live_across_a_break_keep_their_shared_cell(capsys):
    assert run_all(closure_across_break, observe_across_break, x3) == (2, 2)


# ---- functions that refer to themselves (their own cell) --------------------------------------

def recursive_helper(x):
    def g(n):
        return 0 if n == 0 else 1 + g(n - 1)
    return g, x + g(3)


def mutual_recursion_across_break(x):
    def even(n):
        return x if n == 0 else odd(n - 1)

    def odd(n):
        return -x if n == 0 else even(n - 1)
    print("break")
    return even(3), odd


def test_self_recursive_nested_function_is_returned():
    def observe(r, x):
        g = r[0]
        return [g(4), r[1], g.__closure__[0].cell_contents is g]
    assert run_all(recursive_helper, observe, x3) == (1, 1)


def test_mutually_recursive_functions_live_across_a_break(capsys):
    def observe(r, x):
        odd = r[1]
        even = odd.__closure__[odd.__code__.co_freevars.index("even")].cell_contents
        return [r[0], odd(2), even(2), even.__closure__[even.__code__.co_freevars.index("odd")]
                .cell_contents is odd]
    assert run_all(mutual_recursion_across_break, observe, x3) == (1, 1)


# ---- functools.partial made in the frame --------------------------------------------------

def mulf(a, b=1, c=0):
    return a * b + c


EXT = functools.partial(mulf, b=2)


def returns_partials(x):
    p = functools.partial(mulf, x)
    q = functools.partial(p, c=1)  # flattened as CPython does: partial(mulf, x, c=1)
    r = functools.partial(mulf, b=x)
    r.keywords["c"] = 2             # the partial's own keywords dict
    return p, q, r, r.keywords, q(b=3)


def observe_partials(res, x):
    p, q, r, kw, v = res
    return [p.func is mulf, len(p.args), p.keywords, q.func is mulf, len(q.args), q.keywords,
            kw is r.keywords, r(x), q(), v]


def test_partials_made_in_the_frame_are_returned_as_cpython_builds_them():
    assert run_all(returns_partials, observe_partials, x3) == (1, 1)


def partial_of_outside_partial(x):
    q = functools.partial(EXT, c=x)
    return q, q(x)


def test_partial_of_an_outside_partial_is_flattened_by_cpythons_rule():
    def observe(r, x):
        q = r[0]
        return [q.func is mulf, sorted(q.keywords), r[1], q(x)]
    assert run_all(partial_of_outside_partial, observe, x3) == (1, 1)
    # tracing read no attribute that would change eager behaviour (a made `__dict__` stops
    # CPython from flattening)
    assert functools.partial(EXT, c=1).func is mulf


def partial_across_break(x):
    p = functools.partial(mulf, b=x)
    print("break")
    p.keywords["b"] = 3
    return p(x), p


def test_partial_live_across_a_break_then_mutated(capsys):
    assert run_all(partial_across_break,
                   lambda r, x: [r[0], r[1](x), sorted(r[1].keywords)], x3) == (1, 1)


def test_partial_stored_into_an_outside_object():
    def fn(x, box):
        box.p = functools.partial(mulf, c=x * 2)
        return x + 1
    torch.manual_seed(0)
    (x,), box = x3(), Box()
    want = [fn(x, box), box.p(x)]
    cf = ferrodyn.compile(fn, backend=(ours := CountingBackend()))
    for _ in range(2):
        box = Box()
        got = [cf(x, box), box.p(x)]
        assert same(want, got)
    torch._dynamo.reset()
    torch.compile(fn, backend=(theirs := CountingBackend()))(x, Box())
    assert ours.count == theirs.count == 1


# ---- partials and functions from outside the frame -------------------------------------------

def test_store_into_keywords_of_a_partial_from_the_frame_is_replayed():
    def fn(p, x):
        p.keywords["b"] = 3
        return p(x)
    x = torch.ones(2)
    eager_p, ours_p, theirs_p = (functools.partial(mulf, b=2) for _ in range(3))
    want = fn(eager_p, x)
    cf = ferrodyn.compile(fn, backend=(ours := CountingBackend()))
    assert same(cf(ours_p, x), want) and ours_p.keywords == eager_p.keywords
    torch._dynamo.reset()
    torch.compile(fn, backend=(theirs := CountingBackend()))(theirs_p, x)
    assert ours.count == theirs.count == 1


def make_lambda_partial(y):
    return functools.partial(lambda a, b: a * b, b=y)


def test_partials_of_lambdas_from_different_calls_do_not_recompile():
    def fn(f0, f1, x):
        return f0(x) * f1(x)
    x = torch.randn(2, 2)
    cf = ferrodyn.compile(fn, backend=(ours := CountingBackend()))
    torch._dynamo.reset()
    ct = torch.compile(fn, backend=(theirs := CountingBackend()))
    for _ in range(3):  # new lambda objects of one code each call
        p, q = make_lambda_partial(3), make_lambda_partial(2)
        assert same(cf(p, q, x), fn(p, q, x))
        ct(p, q, x)
    assert ours.count == theirs.count == 1


def make_adder(k):
    def add(x):
        return x + k
    return add


def test_is_between_two_closures_of_one_code_follows_the_objects():
    def fn(f, g, x):
        return x + (1 if f is g else 0) + (2 if f == g else 0)
    c1, c2 = make_adder(1), make_adder(2)
    x = torch.zeros(1)
    cf = ferrodyn.compile(fn, backend=CountingBackend())
    for f, g in [(c1, c1), (c1, c2), (c2, c2), (c2, c1)]:
        assert same(cf(f, g, x), fn(f, g, x)), (f, g)


class KeyErrorConfig:
    """`__getattr__` raises KeyError, not AttributeError, for a missing name."""

    def __init__(self):
        self.__dict__["pfx_x"] = torch.ones(2)

    def __getattr__(self, key):
        return self.__dict__[f"pfx_{key}"]


def test_object_whose_getattr_raises_keyerror_is_traced():
    def fn(cfg, y):
        return y + cfg.x
    cfg, y = KeyErrorConfig(), torch.ones(2)
    cf = ferrodyn.compile(fn, backend=(ours := CountingBackend()))
    assert same(cf(cfg, y), fn(cfg, y))
    torch._dynamo.reset()
    torch.compile(fn, backend=(theirs := CountingBackend()))(cfg, y)
    assert ours.count == theirs.count == 1


def test_hasattr_on_partials():
    def fn(p, x):
        q = functools.partial(mulf, x)
        return x + (hasattr(q, "func") + 2 * hasattr(q, "tag") + 4 * hasattr(p, "tag"))
    x = torch.zeros(1)
    tagged = functools.partial(mulf)
    tagged.tag = 1
    cf = ferrodyn.compile(fn, backend=CountingBackend())
    for p in (functools.partial(mulf), tagged, functools.partial(mulf)):
        assert same(cf(p, x), fn(p, x))


def test_partial_of_a_non_callable_raises_like_eager():
    def fn(x):
        return functools.partial(3), x
    with pytest.raises(TypeError):
        fn(torch.ones(1))
    with pytest.raises(TypeError):
        ferrodyn.compile(fn, backend=CountingBackend())(torch.ones(1))


def test_returned_function_is_a_new_object_each_call():
    got = [ferrodyn.compile(returns_closure, backend=CountingBackend())(torch.ones(1))
           for _ in range(2)]
    assert got[0] is not got[1] and isinstance(got[0], types.FunctionType)
    assert got[0].__closure__[0] is not got[1].__closure__[0]


# ---- ints kept in cells -------------------------------------------------------------------

def make_counter():
    c = 0

    def step(x):
        nonlocal c
        c += 1
        return x * c, c
    return step, lambda: c


def test_int_counter_in_a_cell_becomes_dynamic_like_a_local():
    (ours_fn, ours_read), (eager_fn, eager_read), (theirs_fn, _) = (make_counter()
                                                                    for _ in range(3))
    cf = ferrodyn.compile(ours_fn, backend=(ours := CountingBackend()))
    torch._dynamo.reset()
    ct = torch.compile(theirs_fn, backend=(theirs := CountingBackend()))
    x = torch.ones(2)
    for _ in range(5):
        got, want = cf(x), eager_fn(x)
        assert same(want, got) and type(got[1]) is int
        assert ours_read() == eager_read() and type(ours_read()) is int
        ct(x)
    assert ours.count == theirs.count == 2  # static, then a SymInt from the first change on

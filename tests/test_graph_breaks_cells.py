"""Graph breaks in frames with cell variables and in inlined closures (issue 8): the resume
function takes the frame's cell objects as arguments, so functions made before the break and
the code after it share one cell each (a rebinding after the break is seen by a closure made
before it, also once the closure has left the frame). Each test compares ferrodyn with eager
(results, cell contents, identities) and with torch.compile's graph count (CountingBackend on
both), and checks that later calls reuse the compiled entries (closures are made per call)."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def run_both(fn, *args, check=None, calls=3):
    """fn eagerly and compiled (ferrodyn and torch.compile) on the same inputs; `check(got,
    want)` compares one call's results (default: tensors close). Returns (ours, theirs)."""
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    counts = []
    for _ in range(calls):
        want, got = fn(*args), cf(*args)
        (check or _close)(got, want)
        counts.append(ours.count)
    assert counts[-1] == counts[1], counts  # no recompile after the first call
    torch.compile(fn, backend=theirs)(*args)
    assert ours.count <= theirs.count, (ours.count, theirs.count)
    return ours, theirs


def _close(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _close(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert got == want


# -- a frame with cell variables breaks -------------------------------------------------------

def cell_read_after(x):
    k = x.sum()
    def g(y):
        return y + k
    print("break")
    return g(x)


def cell_assigned_after(x):
    def g(y):
        return y * k
    x = x.cos()
    print("break")
    k = x.sum() + 1
    return g(x)


def cell_is_argument(x):
    def g():
        return x * 2
    x = x.cos()                # the argument's cell, rebound before the break
    print("break")
    return g() + 1


def test_inner_function_made_before_the_break(capsys):
    ours, theirs = run_both(cell_read_after, torch.randn(3))
    assert ours.count == theirs.count == 2


def test_cell_assigned_after_the_break(capsys):
    ours, theirs = run_both(cell_assigned_after, torch.randn(3))
    assert ours.count == theirs.count == 2


def argument_cell_used_after(x, n):
    def g():
        return x * n
    x = x.cos()
    print("break")
    x = x + n                  # the argument's cell, written and read in the resume function
    n = n + 1
    return g() + x


def test_argument_cells_read_and_written_after_the_break(capsys):
    ours, theirs = run_both(argument_cell_used_after, torch.randn(3), 2)
    assert ours.count == theirs.count == 2


def test_cell_that_is_an_argument(capsys):
    ours, theirs = run_both(cell_is_argument, torch.randn(3))
    assert ours.count == theirs.count == 2


def rebound_after(x):
    k = x + 1
    def g():
        return k * 2
    print("break")
    k = x - 1                  # a closure made before the break sees this rebinding
    return g(), g


def _check_rebound(got, want):
    _close(got[0], want[0])
    _close(got[1](), want[1]())   # the closure, called after the frame returned
    _close(got[1].__closure__[0].cell_contents, want[1].__closure__[0].cell_contents)


def test_closure_made_before_the_break_sees_a_later_rebinding(capsys):
    ours, _ = run_both(rebound_after, torch.randn(3), check=_check_rebound)
    assert ours.count == 2


def setter_and_getter(x):
    k = x + 1
    def get():
        return k
    def put(v):
        nonlocal k
        k = v
    put(k * 3)                  # a write before the break (a new cell, traced)
    print("break")
    a = get()
    put(a + 10)                 # and one after it, through the same cell
    return a, get(), get, put


def _check_pair(got, want):
    _close(got[:2], want[:2])
    got[3](torch.ones(3))       # the two closures still share one cell after the call
    want[3](torch.ones(3))
    _close(got[2](), want[2]())
    assert got[2].__closure__[0] is got[3].__closure__[0]


def test_two_closures_share_the_cell_across_the_break(capsys):
    ours, _ = run_both(setter_and_getter, torch.randn(3), check=_check_pair)
    assert ours.count == 2


def same_function_twice(x):
    y = x * 2
    def g():
        return y
    keep = [g]
    print("break")
    return keep[0] is g, g() + 1


def test_function_live_in_two_places_is_one_object(capsys):
    ours, _ = run_both(same_function_twice, torch.randn(3))
    assert ours.count == 2


def with_defaults_and_annotations(x):
    k = x + 1
    def g(y: torch.Tensor, s=2.0, *, t=3.0) -> torch.Tensor:
        return (y + k) * s + t
    print("break")
    return g(x), g, g.__defaults__, g.__kwdefaults__, g.__annotations__


def _check_rebuilt(got, want):
    _close(got[0], want[0])
    _close(got[1](torch.ones(3)), want[1](torch.ones(3)))
    assert got[2:] == want[2:]
    assert got[1].__name__ == want[1].__name__ and got[1].__qualname__ == want[1].__qualname__


def test_rebuilt_function_keeps_defaults_and_annotations(capsys):
    run_both(with_defaults_and_annotations, torch.randn(3), check=_check_rebuilt)


def break_in_loop(x):
    acc = x * 0
    def add(v):
        nonlocal acc
        acc = acc + v
    for i in range(3):
        add(x * i)
        print("break", i)
    return acc


def test_break_in_a_loop_of_a_frame_with_cells(capsys):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    x = torch.randn(3)
    cf = ferrodyn.compile(break_in_loop, backend=ours)
    for _ in range(3):
        _close(cf(x), break_in_loop(x))
    torch.compile(break_in_loop, backend=theirs)(x)
    assert ours.count >= 1  # torch.compile runs a frame with a break in a loop eagerly


def conditional_on_tensor(x):
    k = x.sum()
    def g(y):
        return y * k
    if k > 0:                   # a data-dependent jump in a frame with cells
        k = k + 1
    else:
        k = k - 1
    return g(x)


def test_data_dependent_jump_in_a_frame_with_cells():
    for x in (torch.ones(3), -torch.ones(3)):
        run_both(conditional_on_tensor, x)


def two_breaks(x):
    k = x + 1
    def g():
        return k
    print("break 1")
    k = k * 2                  # in the first resume function
    print("break 2")
    k = k + 3                  # in the second: the same cell, handed on
    return g(), k


def test_two_breaks_hand_the_cell_on(capsys):
    ours, theirs = run_both(two_breaks, torch.randn(3))
    assert ours.count == theirs.count == 3


def escapes(x, saved):
    k = x + 1
    def g():
        return k
    saved.append(g)            # the closure leaves the frame before the break
    print("break")
    k = x * 5
    return x.cos()


def test_closure_stored_before_the_break_sees_the_later_rebinding(capsys):
    x = torch.randn(3)
    ours = CountingBackend()
    cf = ferrodyn.compile(escapes, backend=ours)
    for _ in range(3):
        got, want = [], []
        _close(cf(x, got), escapes(x, want))
        _close(got[0](), want[0]())
    assert ours.count == 2


# -- nested breaks: an enclosing frame with cells, an inlined closure --------------------------

def helper_with_cell(x):
    s = x.sin()
    def g(y):
        return y * s
    print("inner break")
    return g(x) + 1


def outer_of_helper(x):
    return helper_with_cell(x * 2) - 1


def outer_with_closure(x):
    k = x + 1
    def inner(y):
        nonlocal k
        z = y * k
        print("break in an inlined closure")
        k = z + 1               # the enclosing frame's cell, written after the break
        return z
    a = inner(x)
    return a, k


def make_counter():
    total = torch.zeros(3)

    def step(x):
        nonlocal total
        total = total + x
        print("break in a closure from outside")
        return total * 2

    return step


def calls_global_closure(x):
    return STEP(x) + 1


STEP = make_counter()


def test_nested_break_in_a_helper_with_cells(capsys):
    ours, theirs = run_both(outer_of_helper, torch.randn(3))
    assert ours.count == 2


def test_nested_break_in_an_inlined_closure_writes_the_enclosing_cell(capsys):
    ours, _ = run_both(outer_with_closure, torch.randn(3))
    assert ours.count == 2


def test_nested_break_in_a_closure_from_outside_keeps_its_cell(capsys):
    global STEP
    torch._dynamo.reset()
    ours = CountingBackend()
    x = torch.randn(3)
    STEP = make_counter()
    cf = ferrodyn.compile(calls_global_closure, backend=ours)
    got = [cf(x) for _ in range(3)]
    got_total = STEP.__closure__[0].cell_contents
    STEP = make_counter()
    want = [calls_global_closure(x) for _ in range(3)]
    _close(got, want)
    _close(got_total, STEP.__closure__[0].cell_contents)
    assert ours.count == 2
    theirs = CountingBackend()
    torch.compile(calls_global_closure, backend=theirs)(x)
    assert ours.count <= theirs.count


# -- what still refuses gives eager's values ---------------------------------------------------

def recursive_inner(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    print("break")               # fact's cell holds fact itself: not rebuilt
    return x * fact(4)


def test_recursive_inner_function_gives_eager_values(capsys):
    x = torch.randn(3)
    ours = CountingBackend()
    cf = ferrodyn.compile(recursive_inner, backend=ours)
    for _ in range(2):
        _close(cf(x), recursive_inner(x))


# -- closures are guarded by their code, not their identity (made per call) --------------------

def make_named(name, scale):
    def g(x):
        return x * scale
    g.__name__ = name            # as functools.wraps does
    return g


def reads_closure(x, g):
    return g(x) + len(g.__name__)


def test_closures_of_one_code_differ_in_name_and_cells():
    ours = CountingBackend()
    cf = ferrodyn.compile(reads_closure, backend=ours)
    x = torch.randn(3)
    for name, scale in (("a", 2.0), ("abc", 3.0), ("a", 5.0), ("abc", 3.0)):
        g = make_named(name, scale)
        _close(cf(x, g), reads_closure(x, g))
    # one entry per (name, float in the cell): both are guarded; the closure's identity is not
    assert ours.count == 3


# -- calls that read their caller's frame are never run by the entry --------------------------

def reads_locals(x):
    y = x + 1
    return sorted(locals())


def make_reads_locals_after_break():
    k = torch.ones(3)

    def f(x):
        y = x + k
        print("break")       # the resume function's own frame holds k's cell: locals() sees k
        return y, sorted(locals().items(), key=lambda kv: kv[0])

    return f


def evaluates(x):
    y = x * 3
    return eval("y + 1")


def test_locals_and_eval_at_a_break_read_the_users_frame(capsys):
    x = torch.randn(3)
    for fn in (reads_locals, evaluates, make_reads_locals_after_break()):
        cf = ferrodyn.compile(fn, backend=CountingBackend())
        for _ in range(2):
            _close(cf(x), fn(x))

"""User-defined generators (variables/generators.py): calling a generator function returns a
tracker whose body runs lazily, one resumption per `next()`, interleaved with its consumer as in
CPython. Each case runs eagerly, through ferrodyn.compile and through torch.compile (a counting
backend on both): results, exceptions and mutated state must be eager's; graph counts are
compared with torch.compile's. Refused uses (send/throw/close, a generator escaping the frame,
a generator left suspended where close() would run code, an infinite generator drained) run
correctly, eagerly or around a graph break."""

import collections.abc
import contextlib
import copy

import pytest
import torch

import ferrodyn
from compiled_vs_eager import check_one_graph_like_torch, run_all, same
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _x():
    return torch.arange(4.0)


def _reasons(fn, *args):
    ferrodyn.reset()
    return [str(r) for r in ferrodyn.explain(fn)(*copy.deepcopy(args)).break_reasons]


# ---- generators captured whole ------------------------------------------------------------

def scaled(x, n):
    for i in range(n):
        yield x * (i + 1)


def for_loop_builds_tensors(x):
    out = []
    for y in scaled(x, 3):
        out.append(y + 1)
    return torch.stack(out)


def list_zip_next(x):
    a = list(scaled(x, 2))
    b = [p - q for p, q in zip(scaled(x, 5), [x, x * 2])]
    g = scaled(x, 4)
    first, second = next(g), next(g)  # then dropped, half consumed
    return a, b, first + second, tuple(scaled(x, 2)), sum(scaled(x, 3))


def inner(x):
    yield x + 1
    yield x + 2
    return x * 10


def outer(x):
    got = yield from inner(x)
    yield got
    yield from [x - 1, x - 2]


def yield_from_with_return_value(x):
    return list(outer(x))


def enumerate_dict_unpack(x):
    d = dict((f"k{i}", v) for i, v in enumerate(scaled(x, 2)))
    a, b, c = scaled(x, 3)
    return d, a + b + c, [i for i, _ in enumerate(scaled(x, 3), start=5)]


class LayerView(collections.abc.Sequence):
    """Like transformers' per-layer config view: `Sequence.__iter__` (a generator with
    `try: ... yield ... except IndexError`) walks `__getitem__` until it raises."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError("list index out of range")
        return i + 1


class Layers:
    def __init__(self, ws):
        self.ws = ws

    def __iter__(self):
        for w in self.ws:
            yield w


def method_iter_is_a_generator(x):
    view = LayerView(3)
    total = x
    for k in view:  # runs the body to the IndexError that ends it
        total = total + k
    kinds = ["a", "b"]
    pairs = list(zip(kinds, view))  # zip stops first: the generator is left suspended
    for w in Layers([x, x * 2]):
        total = total * w
    return total, pairs


@pytest.mark.parametrize("fn", [for_loop_builds_tensors, list_zip_next,
                                yield_from_with_return_value, enumerate_dict_unpack,
                                method_iter_is_a_generator], ids=lambda f: f.__name__)
def test_generator_is_captured_in_one_graph(fn):
    check_one_graph_like_torch(fn, _x())


# ---- order of effects -----------------------------------------------------------------------

def producer(log, x):
    for i in range(3):
        log.append(f"produce {i}")
        yield x + i


def body_and_consumer_share_a_list(x):
    log = []
    seen = []
    for y in producer(log, x):
        seen.append(len(log))   # the consumer reads the list between steps
        log.append("consume")
    return log, seen, y


def inplace_between_steps(t):
    out = []
    for y in (t.add_(1) for _ in range(2)):  # a generator expression is lazy too
        out.append(t.clone())
    return out, t


def short_circuit(x):
    log = []

    def checks():
        for i in range(5):
            log.append(i)
            yield i == 1
    hit = any(checks())
    found = 2 in producer(log, 0)
    return hit, found, log, x + len(log)


def lengths(xs):
    for _ in range(3):
        yield len(xs)


def containers_grow_item_by_item(x):
    """list.extend, `+=` and dict.update take a generator's items one at a time (CPython's
    list_extend / dict merge): the generator sees the container grow."""
    xs = []
    xs.extend(lengths(xs))
    ys = [0]
    ys += lengths(ys)
    d = {}
    d.update((k, len(d)) for k in "abc")
    return x + len(xs), xs, ys, d


def sum_adds_as_it_takes(t):
    def bumped():
        for _ in range(3):
            t.add_(1)
            yield t
    return sum(bumped()), t


def itertools_are_lazy(x):
    import itertools
    log = []

    def counting():
        n = 0
        while True:
            log.append(n)
            yield n
            n += 1
    picked = [x * i for i in itertools.islice(counting(), 2, 9, 3)]
    chained = []
    for i in itertools.chain([1], itertools.islice(counting(), 2), counting()):
        chained.append((i, len(log)))
        if len(chained) > 5:
            break
    return picked, chained, list(log)


def tagged(log, tag, n):
    for i in range(n):
        log.append(f"{tag}{i}")
        yield i


def consumers_interleave_with_the_body(x):
    """zip_longest, pairwise, accumulate, reduce and min/max's key take items (and call their
    function) one at a time: the log records CPython's order."""
    import functools
    import itertools
    import operator
    log = []
    a = list(itertools.zip_longest(tagged(log, "a", 2), tagged(log, "b", 3), fillvalue=-1))
    b = list(itertools.pairwise(tagged(log, "p", 3)))
    c = list(itertools.accumulate(tagged(log, "c", 3)))
    d = list(itertools.accumulate(tagged(log, "d", 2), operator.mul, initial=5))
    e = functools.reduce(lambda s, v: s + [len(log)], tagged(log, "r", 2), [])
    f = max(tagged(log, "m", 3), key=lambda v: (log.append("key"), -v)[1])
    return x + len(log), a, b, c, d, e, f, log


def mutates_outside_list(x, shared):
    for y in producer(shared, x):
        shared.append(y.sum().item() if False else "seen")
    return x + 1


@pytest.mark.parametrize("fn", [body_and_consumer_share_a_list, inplace_between_steps,
                                short_circuit, containers_grow_item_by_item,
                                sum_adds_as_it_takes, itertools_are_lazy,
                                consumers_interleave_with_the_body],
                         ids=lambda f: f.__name__)
def test_effects_interleave_as_in_cpython(fn):
    check_one_graph_like_torch(fn, _x())


def test_mutation_of_a_list_from_outside_is_replayed_in_order():
    shared = ["start"]
    want, got, fd, tc = run_all(mutates_outside_list, _x(), shared)
    assert fd == 1 and tc <= fd, (fd, tc)
    compiled = ferrodyn.compile(mutates_outside_list, backend="eager")
    eager_list, compiled_list = ["start"], ["start"]
    mutates_outside_list(_x(), eager_list)
    compiled(_x(), compiled_list)
    compiled(_x(), compiled_list)  # cache hit: replayed again
    mutates_outside_list(_x(), eager_list)
    assert compiled_list == eager_list


def accumulator(x):
    total = x
    while True:
        got = yield total
        if got is None:
            return total
        total = total + got


def send_values(x):
    g = accumulator(x)
    a = next(g)
    b = g.send(x * 2)
    c = g.send(3)
    g.close()  # suspended outside any try: nothing runs
    h = scaled(x, 3)
    d = h.send(None)
    h.close()
    return a, b, c, d, list(h)


def delegating(x):
    result = yield from accumulator(x)
    yield result * 10


def send_through_yield_from(x):
    g = delegating(x)
    return next(g), g.send(x), g.send(None)


def stop_iteration_in_body(x):
    def bad():
        yield x
        raise StopIteration  # RuntimeError in CPython (PEP 479)
    try:
        return list(bad())
    except RuntimeError as e:
        return x - 1, e.args


@pytest.mark.parametrize("fn", [send_values, send_through_yield_from, stop_iteration_in_body],
                         ids=lambda f: f.__name__)
def test_send_close_and_pep479_are_modelled(fn):
    check_one_graph_like_torch(fn, _x())


# ---- infinite generators --------------------------------------------------------------------

def counter(start):
    n = start
    while True:
        yield n
        n += 1


def infinite_with_break_in_consumer(x):
    for i in counter(1):
        if i > 3:
            break
        x = x * i
    return x


def test_infinite_generator_with_a_break_in_the_consumer_is_one_graph():
    check_one_graph_like_torch(infinite_with_break_in_consumer, _x())


def infinite_drained(x):
    a, b = counter(0)  # ValueError in CPython after taking 3 items
    return x + a + b


def test_infinite_generator_drained_by_unpacking_raises_as_eager():
    """The trace gives up after MAX_YIELDS resumptions; the frame runs eagerly and raises
    eager's ValueError. (Not run through torch.compile: it spends ~15 s tracing this.)"""
    backend = CountingBackend()
    with pytest.raises(ValueError, match="too many values to unpack"):
        ferrodyn.compile(infinite_drained, backend=backend)(_x())
    assert backend.count == 0
    ferrodyn.reset()
    with pytest.raises(ferrodyn.Unsupported, match="resumed more than"):
        ferrodyn.compile(infinite_drained, backend="eager", fullgraph=True)(_x())


# ---- refused: never a wrong value -----------------------------------------------------------

def data_dependent_branch(x):
    for v in x:
        if v.sum() > 1:  # a tensor's truth value: a graph break inside the generator's body
            yield v * 2
        else:
            yield v


def break_inside_body(x):
    y = x + 1
    return list(data_dependent_branch(y)), y * 3


def escapes_by_return(x):
    y = x * 2
    return scaled(y, 2)


class Holder:
    pass


def escapes_into_object(x, holder):
    holder.gen = scaled(x, 2)
    return x + 1


def suspended_in_finally(x, log):
    def guarded():
        try:
            yield x + 1
            yield x + 2
        finally:
            log.append("closed")  # runs when the half-consumed generator is collected
    g = guarded()
    first = next(g)
    del g
    return first, len(log)


def fully_consumed_finally(x, log):
    def guarded():
        try:
            yield x + 1
        finally:
            log.append("finally")
    return list(guarded()), len(log)


def reversed_generator(x):
    try:
        return reversed(scaled(x, 2))  # TypeError: a generator is not reversible
    except TypeError:
        return x - 1


@contextlib.contextmanager
def logged_cm(x, log):
    try:
        yield x + 1
    finally:
        log.append("exit")


def entered_never_exited(x, log):
    cm = logged_cm(x, log)
    value = cm.__enter__()
    del cm  # CPython closes the generator here: its finally runs
    return value, list(log)


@pytest.mark.parametrize("fn,args,words", [
    (escapes_by_return, (), "escapes the frame"),
    (escapes_into_object, (Holder(),), "escapes the frame"),
    (suspended_in_finally, ([],), "left suspended"),
    (reversed_generator, (), "not reversible"),
    (entered_never_exited, ([],), "left suspended"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_refused_uses_run_as_eager(fn, args, words):
    """Results (and state) equal eager's; the refusal is explained."""
    def call(f):
        return f(_x(), *copy.deepcopy(args))
    want = call(fn)
    got = call(ferrodyn.compile(fn, backend="eager"))
    if fn is escapes_by_return:
        want, got = list(want), list(got)
    assert same(want, got), (want, got)
    reasons = _reasons(fn, _x(), *copy.deepcopy(args))
    assert any(words in r for r in reasons), reasons


def test_graph_break_inside_the_body_matches_eager():
    want, got, fd, tc = run_all(break_inside_body, _x())
    reasons = _reasons(break_inside_body, _x())
    assert any("data" in r or "tensor" in r for r in reasons), reasons


def test_generator_with_finally_fully_consumed_is_one_graph():
    check_one_graph_like_torch(fully_consumed_finally, _x(), [])


def test_escaped_generator_still_works_after_the_call():
    compiled = ferrodyn.compile(escapes_by_return, backend="eager")
    assert same(list(compiled(_x())), list(escapes_by_return(_x())))

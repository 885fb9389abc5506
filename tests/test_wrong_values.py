"""Wrong values of issue 7 and their classes: builtin predicates over every kind of tracker,
identity vs equality, augmented assignment with a non-tensor on the left, non-literal dict keys
in generated code, and constant folding that must never run a mutating function on a copy.
Every case is compiled with ferrodyn and compared with eager (and torch.compile's graph count)."""

import collections
import enum
import functools
import math
import operator

import pytest
import torch

import ferrodyn
from compiled_vs_eager import check_one_graph_like_torch, run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Plain:
    pass


class WithCall:
    def __call__(self, y):
        return y


class Holder:
    def __init__(self):
        self.k = 2

    def method(self, y):
        return y * self.k


class AlwaysEq:
    def __eq__(self, other):
        return True


class NeverEq:
    def __eq__(self, other):
        return NotImplemented

    def __ne__(self, other):
        return "ne-called"


class EqBase:
    def __eq__(self, other):
        return "base"


class EqDerived(EqBase):
    def __eq__(self, other):
        return "derived"


class Color(enum.Enum):
    R = 1
    G = 2


Pair = collections.namedtuple("Pair", "a b")


def helper(y, k=1):
    return y * k


def _nested(x, o):
    def inner(y):
        return y + 1
    return inner


KINDS = {
    "int": lambda x, o: 3, "float": lambda x, o: 2.5, "str": lambda x, o: "ab",
    "none": lambda x, o: None, "tuple": lambda x, o: (1, x), "list": lambda x, o: [1, x],
    "dict": lambda x, o: {"a": x}, "set": lambda x, o: {1, 2},
    "frozenset": lambda x, o: frozenset({1}), "tensor": lambda x, o: x,
    "lambda": lambda x, o: (lambda y: y), "nested_def": _nested,
    "global_fn": lambda x, o: helper, "builtin": lambda x, o: len, "class": lambda x, o: Plain,
    "new_obj": lambda x, o: Plain(), "callable_obj": lambda x, o: WithCall(),
    "input_obj": lambda x, o: o, "bound_method": lambda x, o: o.method,
    "list_method": lambda x, o: [1].append,
    "partial": lambda x, o: functools.partial(helper, k=2), "module": lambda x, o: math,
    "namedtuple": lambda x, o: Pair(1, x), "enum": lambda x, o: Color.R,
    "iterator": lambda x, o: iter([1, 2]), "range": lambda x, o: range(3),
    "dtype": lambda x, o: torch.float32,
}

PREDICATES = {
    "callable": callable,
    "isinstance_seq": lambda v: isinstance(v, (list, tuple)),
    "isinstance_dict": lambda v: isinstance(v, dict),
    "isinstance_type": lambda v: isinstance(v, type),
    "type_is_tuple": lambda v: type(v) is tuple,
    "hasattr_call": lambda v: hasattr(v, "__call__"),
    "hasattr_len": lambda v: hasattr(v, "__len__"),
    "hasattr_name": lambda v: hasattr(v, "__name__"),
    "bool": lambda v: bool(v),
    "len": lambda v: len(v),
    "not": lambda v: not v,
}


def _safe(p, v):
    try:
        return p(v)
    except (TypeError, RuntimeError):  # len() of an int, bool() of a tensor: eager raises
        return "TypeError"


@pytest.mark.parametrize("kind", list(KINDS))
def test_builtin_predicates_give_cpythons_answer_for_every_kind(kind):
    make = KINDS[kind]
    sample = make(torch.ones(3), Holder())
    preds = [p for p in PREDICATES.values() if _safe(p, sample) != "TypeError"]
    raising = [p for p in PREDICATES.values() if _safe(p, sample) == "TypeError"]

    def fn(x, o):
        v = make(x, o)
        flags = tuple(p(v) for p in preds)
        return (x + 1 if flags[0] else x - 1), flags

    run_all(fn, torch.ones(3), Holder())
    for p in raising:  # the same exception as eager (compared by run_all)
        run_all(lambda x, o: p(make(x, o)), torch.ones(3), Holder())


def test_callable_of_a_lambda_takes_the_then_branch():
    def fn(x):
        return x + 1 if callable(lambda y: True) else x - 1

    assert check_one_graph_like_torch(fn, torch.ones(3)) == 1


IDENTITY_KINDS = [k for k in KINDS if k not in ("tensor",)]


@pytest.mark.parametrize("kind", IDENTITY_KINDS)
def test_identity_and_equality_of_two_made_values(kind):
    make = KINDS[kind]

    def fn(x, o):
        a, b = make(x, o), make(x, o)
        flags = (a is b, a is not b, a is a)
        if not isinstance(a, (list, tuple, dict)):  # those would compare tensors inside
            flags += (a == b, a != b, a == a, a != a)
        return x + 1, flags

    run_all(fn, torch.ones(3), Holder())


@pytest.mark.parametrize("expr", [
    lambda: Plain() == Plain(), lambda: Plain() is Plain(), lambda: Plain() != Plain(),
    lambda: Plain() is not Plain(), lambda: AlwaysEq() == Plain(),
    lambda: Plain() == AlwaysEq(), lambda: AlwaysEq() != Plain(), lambda: NeverEq() == 1,
    lambda: NeverEq() != NeverEq(), lambda: 1 == NeverEq(), lambda: EqBase() == EqDerived(),
    lambda: EqDerived() == EqBase(), lambda: Plain() in [Plain(), 1],
    lambda: AlwaysEq() in [1], lambda: [AlwaysEq()] == [2], lambda: None == Plain(),
    lambda: Holder().method == Holder().method, lambda: len == len,
])
def test_rich_comparison_of_user_objects(expr):
    def fn(x):
        r = expr()
        return (x + 1 if r else x - 1), r

    run_all(fn, torch.ones(3))


def test_one_object_is_itself_and_inputs_compared_by_identity_are_guarded():
    h = Holder()

    def fn(x, a, b):
        return x + 1 if a is b else x - 1

    c = ferrodyn.compile(fn, backend="eager")
    x = torch.ones(2)
    assert torch.equal(c(x, h, h), fn(x, h, h))
    assert torch.equal(c(x, h, Holder()), fn(x, h, Holder()))
    assert torch.equal(c(x, h, h), fn(x, h, h))


def test_lists_reached_through_two_arguments_are_not_guessed_distinct():
    xs = [1, 2]

    def fn(x, a, b):
        return x + 1 if a is b else x - 1

    c = ferrodyn.compile(fn, backend="eager")
    x = torch.ones(2)
    assert torch.equal(c(x, xs, xs), fn(x, xs, xs))
    assert torch.equal(c(x, xs, [1, 2]), fn(x, xs, [1, 2]))


@pytest.mark.parametrize("start", [0, 1.5, 7])
@pytest.mark.parametrize("op", ["+=", "-=", "*=", "/=", "**=", "//=", "%="])
def test_augmented_assignment_with_a_number_on_the_left(start, op):
    src = f"def fn(t):\n    n = {start!r}\n    n {op} t + 2\n    return n\n"
    ns = {}
    exec(compile(src, "<aug>", "exec"), ns)
    assert check_one_graph_like_torch(ns["fn"], torch.ones(3)) == 1


def test_t5_style_relative_bucketing():
    def fn(rel):
        buckets = 0
        n = -rel
        buckets += (n < 0).to(torch.long) * 16
        n = torch.abs(n)
        return buckets + n

    assert check_one_graph_like_torch(fn, torch.arange(-4, 4)) == 1


def test_augmented_assignment_calls_a_user_iadd():
    class Acc:
        def __init__(self):
            self.v = 0

        def __iadd__(self, other):
            self.v = self.v + 1
            return self

    def fn(x):
        a = Acc()
        b = a
        a += 5
        return x + a.v, a is b

    run_all(fn, torch.ones(2))


@pytest.mark.parametrize("key", [Color.R, torch.float32, 2.5, float("inf"), b"k"])
def test_dict_input_with_non_literal_keys(key):
    def fn(d):
        return d[key] * 2, d

    d = {key: torch.ones(2), "other": 3}
    c = ferrodyn.compile(fn, backend="eager")
    got, want = c(d), fn(d)
    assert torch.equal(got[0], want[0]) and got[1] is d
    ferrodyn.reset()
    assert ferrodyn.explain(fn)(d).break_reasons == []


def test_dict_made_in_the_frame_with_enum_keys():
    def fn(x):
        d = {Color.R: x, Color.G: x + 1}
        return d, d[Color.G] * 2

    assert check_one_graph_like_torch(fn, torch.ones(2)) == 1


def _append_through_type(x):
    xs = [1]
    list.append(xs, 3)
    list.extend(xs, [4])
    return x * len(xs), xs


def _setitem_through_operator(x):
    d = {}
    operator.setitem(d, "a", 2)
    dict.__setitem__(d, "b", 3)
    dict.update(d, c=4)
    operator.delitem(d, "a")
    return x * len(d), d


def _set_through_type(x):
    s = {1}
    set.add(s, 2)
    return x * len(s), s


def _max_keeps_identity(x):
    a, b = [1, 2], [1, 3]
    m = max([a, b])
    m.append(9)
    return x + len(b), b


def _iadd_through_operator(x):
    xs = [1]
    ys = operator.iadd(xs, [2])
    return x * len(xs), ys is xs


@pytest.mark.parametrize("fn", [_append_through_type, _setitem_through_operator,
                                _set_through_type, _max_keeps_identity, _iadd_through_operator])
def test_folding_never_mutates_a_copy(fn):
    run_all(fn, torch.ones(2))


@pytest.mark.parametrize("make", [
    lambda o: 3, lambda o: "ab", lambda o: (1, "a"), lambda o: None, lambda o: Color.G,
    lambda o: frozenset({1}), lambda o: o, lambda o: Holder,
])
def test_hash_is_cpythons_or_refused(make):
    h = Holder()

    def fn(x, o):
        return x + 1, hash(make(o))

    c = ferrodyn.compile(fn, backend="eager")  # (not deep-copied: hashes of the same objects)
    for o in (h, Holder(), h):  # another object: the identity guard fails
        assert c(torch.ones(2), o)[1] == fn(torch.ones(2), o)[1]
    ferrodyn.reset()
    assert ferrodyn.explain(fn)(torch.ones(2), h).break_reasons == []


@pytest.mark.parametrize("make", [lambda: [1], lambda: {"a": 1}, lambda: Holder(),
                                  lambda: AlwaysEq()])
def test_hash_of_unhashable_or_new_values_is_not_guessed(make):
    def fn(x):
        try:
            return x + 1, hash(make()) is not None
        except TypeError:
            return x - 1, False

    run_all(fn, torch.ones(2))

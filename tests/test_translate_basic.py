"""Captured graph == eager for inputs, constants, outputs, operators, containers,
comprehensions, f-strings, trace-time control flow and builtins (one graph per frame)."""

import collections
import dataclasses
import math

import pytest
import torch

from translate_harness import check, count_ops, guard_kinds, trace
from ferrodyn.guard_spec import GuardKind
from ferrodyn.trace_result import OutGraph, OutSource

Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: int = 3


def t(*shape):
    return torch.randn(*shape)


# ---- inputs, constants, outputs ------------------------------------------------------------

def ret_mixed(x, n, f, b, s):
    return x * n + f, n + 1, f * 2.0, not b, s + "!", None


def ret_containers(x, xs, d):
    return [x, xs[0] + 1], {"a": d["k"] * 2, "b": (x, 1)}, (d, xs)


def ret_slice_range(x, sl, r):
    return x[sl], list(r), sl, r


def ret_namedtuple(p):
    return Point(p.x + 1, p.y * 2), p.x


def ret_dataclass(pair):
    return Pair(pair.a * pair.b, pair.b + 1)


def nested_inputs(cfg):
    return cfg["layers"][1]["w"] @ cfg["layers"][0]["w"], cfg["scale"]


@pytest.mark.parametrize("fn,args", [
    (ret_mixed, (t(3), 2, 1.5, True, "s")),
    (ret_containers, (t(2), [t(2), t(2)], {"k": t(2)})),
    (ret_slice_range, (t(6), slice(1, 5, 2), range(3))),
    (ret_namedtuple, (Point(t(2), t(2)),)),
    (ret_dataclass, (Pair(t(2), 4),)),
    (nested_inputs, ({"layers": [{"w": t(3, 3)}, {"w": t(3, 3)}], "scale": 2.0},)),
])
def test_inputs_and_outputs(fn, args):
    check(fn, *args)


def test_constant_inputs_are_guarded_when_used():
    def f(x, n, unused):
        return x * n
    r = check(f, t(2), 3, 7)
    assert {GuardKind.TYPE_MATCH, GuardKind.EQUALS} <= guard_kinds(r, "L['n']")
    assert guard_kinds(r, "L['unused']") == set()
    assert GuardKind.TENSOR_MATCH in guard_kinds(r, "L['x']")
    assert any(g.kind is GuardKind.GLOBAL_STATE for g in r.guards)


def test_returning_an_input_returns_it_unchanged():
    def f(x, xs):
        return x, xs
    r = trace(f, t(2), [1, 2])
    assert r.output.items[0] == OutSource(r.graph_inputs[0])
    assert isinstance(r.output.items[1], OutSource)


def test_graph_inputs_have_real_example_values():
    x = t(2, 3)
    r = trace(lambda a: a.sin(), x)
    assert r.example_inputs[0] is x
    assert [n.op for n in r.graph.graph.nodes].count("placeholder") == 1


# ---- operators ----------------------------------------------------------------------------

def arith(x, y, n, f):
    a = x + y - x * y / (y.abs() + 1)
    b = x // 2 + x % 3 + x ** 2 + (-x) + (+y) + abs(x)
    c = n * 3 + n // 2 + n % 3 + n ** 2 - f / 2 + (n << 1) + (n >> 1) + (n & 1) + (n | 2) + (n ^ 3)
    m = x @ y.T
    cmp = (x > y).float() + (x <= 0.5).float() + (x == y).float() + (x != y).float()
    return a, b, c, m, cmp, n < f, n == 2, ~n, -f


def inplace(x, y, n):
    x += 1
    y *= 2
    n += 3
    z = x.clone()
    z -= y
    z /= 2
    return x, y, z, n


def inplace_input_method(x):
    x.add_(1)
    x.mul_(2)
    return x.sum()


def setitem_tensor(x):
    x[0] = 5.0
    x[1:, 0] = x[1:, 1]
    return x


def bool_int_ops(x):
    a = torch.ones(3, dtype=torch.bool) & (x > 0)
    return a | (x < 0), a ^ (x > 1), ~a


def tuple_concat(x, y):
    acc = ()
    acc = acc + (x,)
    acc += (y, 3)
    acc = (1,) + acc
    return acc, (x * 2,) + (), [x] + [], acc * 2


@pytest.mark.parametrize("fn,args", [
    (arith, (t(3, 3), t(3, 3), 5, 2.5)),
    (tuple_concat, (t(3), t(2))),
    (inplace, (t(3), t(3), 2)),
    (inplace_input_method, (t(4),)),
    (setitem_tensor, (t(3, 3),)),
    (bool_int_ops, (t(3),)),
])
def test_operators(fn, args):
    check(fn, *args)


def test_inplace_on_input_happens_once_per_graph_run():
    x = torch.zeros(3)
    r = trace(inplace_input_method, torch.zeros(3))
    r.graph(x)
    torch.testing.assert_close(x, torch.full((3,), 2.0))
    r.graph(x)
    torch.testing.assert_close(x, torch.full((3,), 6.0))


# ---- containers --------------------------------------------------------------------------

def containers(x, xs, d):
    a, b, *rest = xs
    first, *mid, last = (1, 2, 3, 4)
    lst = [x, x + 1]
    lst.append(x * 2)
    lst.extend([a, b])
    lst.insert(0, b)
    popped = lst.pop()
    lst[1] = lst[1] * 10
    del lst[0]
    tup = tuple(lst) + (a,)
    dd = dict(d)
    dd["new"] = x
    dd.update(z=b)
    keys = list(dd.keys())
    merged = {**d, "m": a}
    return (tup[1:3], tup[-1], len(lst), rest, first, mid, last, popped, keys,
            dd["new"], merged, [v for v in dd.values()][0], d.get("missing", 7), "k" in d)


def comprehensions(x, xs, d):
    sq = [v * v for v in xs]
    ev = [i for i in range(10) if i % 2 == 0]
    dc = {k: v + 1 for k, v in d.items()}
    nested = [[i * j for j in range(3)] for i in range(2)]
    g = sum(v.sum() for v in xs)
    tu = tuple(v + 1 for v in xs)
    return sq, ev, dc, nested, g, tu, any(i > 8 for i in ev), all(i < 100 for i in ev)


def fstrings(x, n, name):
    s = f"{name}-{n:03d}-{n!r}-{1.5:.2f}"
    return x.sum(), s, "{}_{}".format(name, n), "-".join([name, str(n)])


def slices_and_unpack(x):
    a, b = x.shape
    h, *tail = x
    return x[::2], x[:, 1:], x[..., None], x[None, 0], x[-1], a, b, h, len(tail)


@pytest.mark.parametrize("fn,args", [
    (containers, (t(2), [t(2), t(2), t(2)], {"k": t(2), "j": t(2)})),
    (comprehensions, (t(2), [t(2), t(2)], {"a": t(2), "b": t(2)})),
    (fstrings, (t(2), 7, "abc")),
    (slices_and_unpack, (t(4, 3),)),
])
def test_containers(fn, args):
    check(fn, *args)


def test_list_input_iterated_is_length_guarded():
    def f(xs):
        return [v + 1 for v in xs]
    r = check(f, [t(2), t(2)])
    assert GuardKind.LENGTH in guard_kinds(r, "L['xs']")


def test_dict_input_iterated_is_keys_guarded():
    def f(d):
        return {k: v * 2 for k, v in d.items()}
    r = check(f, {"a": t(2), "b": t(1)})
    assert GuardKind.DICT_KEYS in guard_kinds(r, "L['d']")


# ---- control flow ------------------------------------------------------------------------

FLAG = True


class Config:
    use_relu = False


CONFIG = Config()


def control(x, n, mode, xs):
    if n > 2:
        x = x + 1
    else:
        x = x - 1
    if x.shape[0] == 3 and x.dim() == 1:
        x = x * 2
    if isinstance(n, int) and not isinstance(n, bool):
        x = x + n
    if FLAG:
        x = x.sin()
    if CONFIG.use_relu:
        x = x.relu()
    if mode is None:
        x = x * 3
    elif mode == "a":
        x = x * 4
    i = 0
    while i < n:
        x = x + i
        i += 1
    for j, v in enumerate(xs):
        if j == 1:
            continue
        x = x + v
        if j > 5:
            break
    for k in reversed(range(2)):
        x = x * (k + 1)
    for a, b in zip(xs, xs[1:]):
        x = x + a * b
    y = x if n else -x
    z = n > 1 and n < 10 or n == 0
    return x, y, z


@pytest.mark.parametrize("n,mode", [(3, None), (1, "a"), (0, "b")])
def test_control_flow(n, mode):
    check(control, t(3), n, mode, [t(3), t(3), t(3)])


def test_global_config_flag_is_guarded():
    r = check(control, t(3), 3, None, [t(3)])
    names = {g.source.name() for g in r.guards if g.source is not None}
    assert "G['FLAG']" in names
    assert any("use_relu" in n for n in names)


# ---- builtins ----------------------------------------------------------------------------

def builtins_fn(x, xs, n, f):
    out = []
    out.append(len(xs) + len(x))
    out.append(isinstance(x, torch.Tensor) + issubclass(bool, int))
    out.append(list(range(1, n, 2)))
    out.append([i for i, _ in enumerate(xs, 1)])
    out.append(min(n, 3, 7) + max([n, 9]) + abs(-n) + sum([1, 2, n]))
    out.append(any([False, n > 1]) and all([True, n > 0]))
    out.append(getattr(x, "ndim") + getattr(x, "nope", 5) + hasattr(x, "shape"))
    out.append(type(n) is int and type(x) is torch.Tensor)
    out.append(tuple(range(3)) + tuple([n]))
    out.append(dict(a=1, b=n))
    out.append(int(f) + float(n) + bool(n) + int("3"))
    out.append(str(n) + str(f))
    out.append(sorted([3, n, 1], reverse=True))
    out.append(sorted(["bb", "a", "ccc"], key=len) + sorted([3, 1, 2], key=lambda v: -v))
    out.append(round(f, 1) + math.sqrt(16) + math.floor(f))
    out.append(abs(x) + sum(xs) + max(f, 1.0))
    return out


def test_builtins():
    check(builtins_fn, t(2), [t(2), t(2)], 4, 2.7)

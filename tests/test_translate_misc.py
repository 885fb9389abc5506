"""Assorted language constructs: chained comparisons, walrus, user dunder methods
(__call__, __getitem__, __len__, __iter__, __add__, __enter__/__exit__), %-formatting,
assert, del, star-forwarding, nested defaults."""

import pytest
import torch

from translate_harness import check


class Bag:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __iter__(self):
        return iter(self.items)

    def __call__(self, x):
        return x * len(self.items)

    def __add__(self, other):
        return Bag(self.items + other.items)


class Scale:
    def __init__(self, k):
        self.k = k
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self.k

    def __exit__(self, *exc):
        self.entered -= 1
        return False


def constructs(x, n, bag):
    a = 0 < n < 10
    b = (m := n * 2) > 3
    assert x.dim() == 1, "1-d"
    s = "%s-%d" % ("v", n)
    tmp = n + 1
    del tmp
    parts = [x, x * 2]
    cat = torch.cat([*parts, x])
    kw = {"dim": 0}
    st = torch.stack(parts, **kw)
    c = bag(x) + bag[0] + sum(t for t in bag) + len(bag)
    both = bag + Bag([x])
    with Scale(3) as k:
        y = x * k

    def nested(v, scale=n):
        return v * scale
    return a, b, m, s, cat, st, c, len(both.items), y, nested(x), x if n else x * 0


@pytest.mark.parametrize("n", [0, 4])
def test_constructs(n):
    check(constructs, torch.randn(3), n, Bag([torch.randn(3), torch.randn(3)]))


def kwonly(x, *, alpha=1.0, beta):
    return x * alpha + beta


def forwarding(x, *args, **kwargs):
    return kwonly(x, *args, **kwargs), len(args), sorted(kwargs)


def test_star_forwarding():
    check(forwarding, torch.randn(2), alpha=2.0, beta=1.0)


def test_tensor_indexing_forms():
    def f(x, idx):
        return (x[idx], x[[0, 2]], x[x > 0.5] if False else x[1:3, None],
                x[..., 0], x[torch.tensor([1, 0])])
    check(f, torch.randn(4, 3), torch.tensor([0, 1]))


def sets(x, names, flags):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    t = set([3, 4, 5]) | {9}
    u = {n * 2 for n in range(4)}
    s |= {10}
    common = s & t
    k = x
    for v in sorted(common):
        k = k + v
    return (k, s, t - s, u, len(s), 3 in s, "a" in names, common == {3, 4},
            frozenset(s) == frozenset(s), names, flags)


def test_sets():
    r = check(sets, torch.randn(2), {"a", "b"}, frozenset({"x"}))


def iters(x, xs):
    import itertools
    out = x
    for a, b in itertools.product(range(2), [1, 2]):
        out = out + a * b
    chained = list(itertools.chain(xs, [x]))
    reps = list(itertools.repeat(2, 3))
    first_two = list(itertools.islice(xs, 2))
    return out, len(chained), reps, first_two, x.__class__ is torch.Tensor


def test_itertools_and_class():
    check(iters, torch.randn(2), [torch.randn(2), torch.randn(2), torch.randn(2)])


def test_pow_round_builtins_on_tensors():
    def f(x, n):
        return pow(x, 2), pow(n, 2), pow(3, 2, 5), round(2.567, 1), round(n / 3)
    check(f, torch.randn(3) * 3, 4)


def test_inplace_result_is_the_same_tensor_and_finfo():
    def f(x):
        y = x.add_(1)
        z = x
        z += 1
        big = torch.finfo(x.dtype).max
        return y is x, z is x, x * 2, x.masked_fill(x > 100, torch.finfo(x.dtype).min), big
    r = check(f, torch.randn(3))
    assert r.output.items[0].value is True and r.output.items[1].value is True


def test_ordered_dict_created_in_frame():
    import collections

    def f(x):
        d = collections.OrderedDict()
        d["b"] = x
        d["a"] = x * 2
        return d, list(d)
    check(f, torch.randn(2))


def test_comprehension_variables_captured_by_lambdas():
    def f(x):
        fns = [lambda v, i=i: v * i for i in range(3)]
        late = [lambda v: v + j for j in range(2)]
        return [g(x) for g in fns], [g(x) for g in late]
    check(f, torch.randn(2))


def test_min_max_with_key():
    def f(x, xs):
        longest = max(xs, key=lambda t: t.shape[0])
        first = min(["bb", "a", "ccc"], key=len)
        return longest * x.sum(), first
    check(f, torch.randn(2), [torch.randn(2), torch.randn(5), torch.randn(3)])

"""itertools over known inputs (variables/itertools_vars.py): each function captured in one
graph, its items, their order and identity, and *when* it takes items from a generator input or
calls a key/predicate (the LOG of a producer) as eager does. Each case: ferrodyn vs eager
(results and state after every call) and graph counts no more than torch.compile's."""

import textwrap

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from side_effects_harness import differential

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

PRELUDE = """
import itertools
LOG = []

def producer(n):
    for i in range(n):
        LOG.append(i)           # when the consumer takes item i
        yield i

def key_of(v):
    LOG.append(-100 - v)
    return v // 2
"""

CASES = {
    "combinations_tensor_sizes": """
        def f(x):
            out = []
            for size in itertools.combinations((1, 2, 3, 4), 2):
                out.append(torch.ones(size) + x.sum())
            return out
    """,
    "combinations_of_tensors_keeps_identity": """
        def f(x):
            ts = [x, x + 1, x * 2]
            return [a * b for a, b in itertools.combinations(ts, 2)], \
                [a is ts[0] for a, _ in itertools.combinations(ts, 2)]
    """,
    "combinations_r_too_big_and_zero": """
        def f(x):
            return x + len(list(itertools.combinations(range(3), 5))), \
                list(itertools.combinations(range(3), 0))
    """,
    "combinations_with_replacement": """
        def f(x):
            return [x * a + b for a, b in itertools.combinations_with_replacement(range(3), 2)]
    """,
    "permutations_default_and_r": """
        def f(x):
            return list(itertools.permutations("abc")), \
                [x + a - b for a, b in itertools.permutations([1, 2, 3], 2)]
    """,
    "permutations_takes_generator_at_construction": """
        def f(x):
            it = itertools.permutations(producer(3), 2)
            n = len(LOG)
            return x + n, list(it), list(LOG)
    """,
    "product_repeat_and_mixed": """
        def f(x):
            return [x * i + j for i, j in itertools.product(range(2), [5, 6])], \
                list(itertools.product("ab", repeat=2))
    """,
    "islice_stop_start_step": """
        def f(x):
            a = list(itertools.islice(range(10), 3))
            b = list(itertools.islice(range(10), 2, 9, 3))
            c = list(itertools.islice(range(10), 4, None))
            return x + sum(a) + sum(b) + sum(c), a, b, c
    """,
    "islice_does_not_take_past_stop": """
        def f(x):
            g = producer(10)
            r = list(itertools.islice(g, 1, 4))
            return x + sum(r), r, list(LOG), next(g)
    """,
    "chain_from_iterable_is_lazy": """
        def f(x):
            it = itertools.chain.from_iterable([producer(2), producer(3)])
            first = next(it)
            seen = list(LOG)
            return x + first, seen, list(it), list(LOG)
    """,
    "chain_of_tensors_and_lists": """
        def f(x):
            return sum(itertools.chain([x, x * 2], (x + 1,)))
    """,
    "groupby_default_key": """
        def f(x):
            out = []
            for k, grp in itertools.groupby([1, 1, 2, 3, 3, 3, 1]):
                out.append((k, len(list(grp))))
            return x + len(out), out
    """,
    "groupby_key_calls_and_skipped_groups": """
        def f(x):
            groups = itertools.groupby(producer(7), key=key_of)
            k1, g1 = next(groups)
            first = next(g1)
            k2, g2 = next(groups)      # the rest of group 1 is skipped
            stale = list(g1)           # a grouper left behind is exhausted
            return x + first, (k1, k2, stale, list(g2), list(LOG))
    """,
    "groupby_tensors_by_constant_key": """
        def f(x):
            ts = [x, x + 1, x + 2, x + 3]
            return [k + sum(t for _, t in g) for k, g in
                    itertools.groupby(zip([0, 0, 1, 1], ts), key=lambda p: p[0])]
    """,
    "count_with_zip_and_float_step": """
        def f(x):
            pairs = list(zip(itertools.count(5), "abc"))
            floats = list(itertools.islice(itertools.count(0.0, 0.1), 12))
            return x + pairs[-1][0], pairs, floats
    """,
    "repeat_and_cycle": """
        def f(x):
            a = list(itertools.repeat(x, times=3)) + list(itertools.repeat(object=x, times=0))
            b = list(zip(range(7), itertools.cycle("ab")))
            c = list(zip(range(4), itertools.repeat(2)))
            return sum(a), a[0] is x, b, c
    """,
    "cycle_takes_generator_lazily": """
        def f(x):
            it = itertools.cycle(producer(2))
            first = [next(it), next(it), next(it)]
            return x + len(LOG), first, list(LOG)
    """,
    "takewhile_dropwhile_filterfalse": """
        def f(x):
            a = list(itertools.takewhile(lambda v: v < 3, [1, 2, 3, 1]))
            b = list(itertools.dropwhile(lambda v: v < 3, [1, 2, 3, 1]))
            c = list(itertools.filterfalse(lambda v: v % 2, range(6)))
            d = list(itertools.filterfalse(None, [0, 1, "", "a"]))
            return x + len(a) + len(b), a, b, c, d
    """,
    "takewhile_stops_taking_items": """
        def f(x):
            g = producer(6)
            r = list(itertools.takewhile(lambda v: v < 2, g))
            return x + sum(r), r, list(LOG), next(g)
    """,
    "compress_and_starmap": """
        def f(x):
            a = list(itertools.compress("abcdef", [1, 0, 1, 0, 1]))
            b = list(itertools.starmap(lambda t, k: t * k, [(x, 2), (x, 3)]))
            return a, b
    """,
    "tee_shares_one_producer": """
        def f(x):
            a, b = itertools.tee(producer(3))
            first = next(a)
            r = (list(b), list(a), list(LOG))
            return x + first, r
    """,
    "accumulate_pairwise_zip_longest": """
        def f(x):
            acc = list(itertools.accumulate([x, x, x]))
            pairs = list(itertools.pairwise([1, 2, 3]))
            zl = list(itertools.zip_longest([1, 2], "abc", fillvalue=0))
            return acc, pairs, zl
    """,
}


def _args(name):
    return lambda g: (torch.arange(4.0),)


@pytest.mark.parametrize("name", sorted(CASES))
def test_itertools_matches_eager_in_one_graph(name):
    src = PRELUDE + textwrap.dedent(CASES[name])
    out = differential(src, "f", _args(name), state=lambda g: list(g["LOG"]),
                       compare_torch_count=False)
    ours, theirs = out["ferrodyn"][1], out["torch"][1]
    assert ours == 1, f"{name}: ferrodyn {ours} graphs"
    assert ours <= theirs, f"{name}: ferrodyn {ours} graphs, torch.compile {theirs}"


def test_unbounded_count_is_refused_not_hung():
    """`list(count())` never ends eagerly; at trace time the model stops at its cap and the
    construct is refused with a reason (fullgraph: Unsupported names it)."""
    import itertools

    def f(x):
        return x + len(list(itertools.count()))
    with pytest.raises(ferrodyn.Unsupported, match="count"):
        ferrodyn.compile(f, backend=CountingBackend(), fullgraph=True)(torch.ones(2))


@pytest.mark.parametrize("call, exc", [
    ("itertools.combinations(range(3), -1)", ValueError),
    ("itertools.islice(range(3), -1)", ValueError),
    ("itertools.permutations(range(3), 'a')", TypeError),
])
def test_bad_arguments_raise_eagers_error(call, exc):
    """What CPython rejects is never traced into a value: the frame runs eagerly and raises
    the same exception type."""
    g = {"torch": torch}
    exec(f"import itertools\ndef f(x):\n    return x + len(list({call}))", g)
    with pytest.raises(exc):
        g["f"](torch.ones(1))
    with pytest.raises(exc):
        ferrodyn.compile(g["f"], backend=CountingBackend())(torch.ones(1))

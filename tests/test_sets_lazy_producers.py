"""Set methods fed by an iterator (a generator, `map`, a generator expression) take its items as
CPython does: `update` and `difference_update` one at a time (the producer sees the set change
between items), `isdisjoint` and `issuperset` stop at the first item that decides (the rest is
never produced). Each case: ferrodyn vs eager (results and state after every call, the
producer's log included) and graph counts against torch.compile's."""

import textwrap

import pytest
import torch

from side_effects_harness import differential

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

PRELUDE = """
LOG = []

def producer(s, n):
    for i in range(n):
        LOG.append(len(s))      # what the producer sees of the set, item by item
        yield len(s) + 10 * i
"""

CASES = {
    "update_sees_growth": """
        def f(x):
            s = {1}
            s.update(producer(s, 3))
            return x + len(s), sorted(s)
    """,
    "update_genexpr_sees_growth": """
        def f(x):
            s = {1}
            s.update(len(s) + i for i in range(3))
            return x * len(s), sorted(s)
    """,
    "update_with_map": """
        def f(x):
            s = {0, 1}
            s.update(map(lambda i: len(s) + i, range(3)))
            return x - len(s), sorted(s)
    """,
    "difference_update_sees_shrinking": """
        def f(x):
            s = {0, 1, 2, 3, 4, 5, 6, 7}
            s.difference_update(len(s) - 1 - i for i in range(4))
            return x + len(s), sorted(s)
    """,
    "isdisjoint_stops_at_first_common": """
        def f(x):
            s = {1, 12, 30}
            r = s.isdisjoint(producer(s, 5))
            return x + len(LOG), r, list(LOG)
    """,
    "issuperset_stops_at_first_missing": """
        def f(x):
            s = {3, 13, 50}
            r = s.issuperset(producer(s, 5))
            return x + len(LOG), r, list(LOG)
    """,
    "isdisjoint_of_a_new_set_with_map": """
        def f(x):
            s = set(range(3))
            seen = []
            r = s.isdisjoint(map(lambda i: seen.append(i) or i + 2, range(5)))
            return x + len(seen), r, seen
    """,
    "update_of_a_set_passed_in": """
        def f(x, s):
            s.update(producer(s, 2))
            return x + len(s)
    """,
}


def _args(name):
    if name == "update_of_a_set_passed_in":
        return lambda g: (torch.ones(2), {5, 6})
    return lambda g: (torch.ones(2),)


@pytest.mark.parametrize("name", sorted(CASES))
def test_lazy_producers_feed_set_methods_item_by_item(name):
    src = PRELUDE + textwrap.dedent(CASES[name])
    out = differential(src, "f", _args(name), state=lambda g: list(g["LOG"]),
                       compare_torch_count=False)
    ours, theirs = out["ferrodyn"][1], out["torch"][1]
    assert ours == 1, f"{name}: ferrodyn {ours} graphs"
    assert ours <= theirs, f"{name}: ferrodyn {ours} graphs, torch.compile {theirs}"

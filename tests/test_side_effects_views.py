"""Dict views and iterators stay live; list iterators, reversed, enumerate and zip over a list
mutated during iteration behave as CPython's; a hypothesis-generated program over lists, dicts
and objects with aliasing (mutations through one name, reads through another) is run compiled
and eagerly with the state compared after every call."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from side_effects_harness import differential

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

VIEW_CASES = {
    "keys_live": """
        def f(d, x):
            keys = d.keys()
            d[4] = x
            return x + (4 in keys) + len(keys)
    """,
    "values_items_live": """
        def f(d, x):
            vals, items = d.values(), d.items()
            d["z"] = 3
            return x + len(vals) + (("z", 3) in items) + sum(v for v in vals if isinstance(v, int))
    """,
    "view_in_new_dict": """
        def f(x):
            d = {"a": 1}
            k = d.keys()
            d["b"] = 2
            del d["a"]
            return x + len(k), list(k)
    """,
    "iterate_with_value_updates": """
        def f(d, x):
            for k in d:
                d[k] = d[k] + 1
            return x + sum(d.values())
    """,
    "list_iterator_sees_appends": """
        def f(xs, x):
            out = []
            for v in xs:
                if len(xs) < 5:
                    xs.append(v + 1)
                out.append(v)
            return x + len(out), out
    """,
    "enumerate_sees_appends": """
        def f(xs, x):
            out = []
            for i, v in enumerate(xs):
                if i < 2:
                    xs.append(v * 10)
                out.append((i, v))
            return x + 1, out
    """,
    "reversed_after_append": """
        def f(xs, x):
            r = reversed(xs)
            xs.append(9)
            return x + 1, list(r)
    """,
    "reversed_after_pop": """
        def f(xs, x):
            r = reversed(xs)
            first = next(r)
            xs.pop()
            xs.pop()
            return x + first, list(r)
    """,
    "exhausted_iterator_stays_exhausted": """
        def f(xs, x):
            it = iter(xs)
            a = list(it)
            xs.append(7)
            return x + 1, a, list(it)
    """,
    "zip_lazy": """
        def f(xs, x):
            out = []
            for a, b in zip(xs, [10, 20, 30]):
                xs.append(a)
                out.append(a + b)
            return x + 1, out
    """,
    "zip_strict_equal_lengths": """
        def f(xs, x):
            out = []
            for a, b in zip(xs, [10, 20], strict=True):
                out.append(a + b)
            return x + 1, out
    """,
    "zip_strict_mismatch_raises": """
        def f(xs, x):
            out = []
            for a, b in zip(xs, [10, 20, 30], strict=True):
                out.append(a + b)
            return x + 1, out
    """,
    "map_is_lazy_and_interleaves": """
        def f(xs, x):
            log = []
            def g(v):
                log.append(["g", v])
                return v * 2
            for y in map(g, xs):
                log.append(["body", y])
                if len(xs) < 4:
                    xs.append(y)
            return x + len(log), log
    """,
    "map_partially_consumed": """
        def f(xs, x):
            calls = []
            def g(v):
                calls.append(v)
                return v
            m = map(g, xs)
            first = next(m)
            return x + first, calls
    """,
    "filter_is_lazy": """
        def f(xs, x):
            seen = []
            def keep(v):
                seen.append(v)
                return v % 2
            out = []
            for v in filter(keep, xs):
                out.append(v)
                xs.append(v + 1) if len(xs) < 4 else None
            return x + 1, seen, out
    """,
}


@pytest.mark.parametrize("name", sorted(VIEW_CASES))
def test_views_and_iterators_are_live(name):
    src = VIEW_CASES[name]
    if "def f(x)" in src:
        make = lambda g: (torch.ones(2),)  # noqa: E731
    elif "def f(d," in src:
        make = lambda g: ({"a": 1, "b": 2}, torch.ones(2))  # noqa: E731
    else:
        make = lambda g: ([1, 2], torch.ones(2))  # noqa: E731
    raises = name.endswith("_raises")
    out = differential(src, "f", make, calls=2, compare_torch_count=not raises)
    assert out["ferrodyn"][1] == (0 if raises else 1)


def test_dict_changed_size_during_iteration_raises_like_eager():
    src = """
        def f(d, x):
            for k in d:
                d[k + 1] = 0
            return x
    """
    out = differential(src, "f", lambda g: ({1: 1}, torch.ones(2)), calls=1,
                       compare_torch_count=False)
    assert out["ferrodyn"][0][0][0][1][0] == "raised"


# ---- hypothesis: random programs with aliasing --------------------------------------------

STATEMENTS = [
    "a.append(len(b))",
    "b.append(len(a) + 1)",
    "if a: a.pop()",
    "a[:] = b[:2]",
    "d[len(a) % 3] = len(b)",
    "d.pop(1, None)",
    "r.append(len(kv))",
    "r.append(2 in kv)",
    "o.n = o.n + len(a)",
    "o.items.append(o.n)",
    "o.items = b",
    "r.append(len(o.items))",
    "x = x + len(a) + len(d)",
    "r.append(a is b)",
    "r.append(o.items is a)",
    "e.append(len(r))",
    "G.append(len(a))",
    "CNT += len(G)",
    "r.append(CNT)",
    "d[2] = G",
    # sets: `s` and `o.tags` may be one set; members by value and by identity
    "s.add(len(a))",
    "o.tags.discard(1)",
    "s.update([len(b), 7])",
    "r.append(sorted(o.tags))",
    "r.append(len(a) in s)",
    "s.add(o)",
    "r.append(o in o.tags)",
    "o.tags.discard(o)",
    "r.append(len(s))",
]


class Obj:
    pass


def _program(stmts):
    body = "\n".join("    " + s for s in stmts)
    return ("G = []\nCNT = 0\n"
            f"def f(a, b, d, o, e, x, s):\n    global CNT\n    r = []\n    kv = d.keys()\n{body}\n"
            "    return x, r\n")


def _args(alias_ab, alias_items, alias_e):
    def make(g):
        a = [1, 2]
        b = a if alias_ab else [3]
        o = g["Obj"]()
        o.n = 0
        o.items = a if alias_items else [5]
        s = {1, 2}
        o.tags = s if alias_e else {1}
        e = b if alias_e else []
        return a, b, {0: 1}, o, e, torch.ones(2), s
    return make


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(stmts=st.lists(st.sampled_from(STATEMENTS), min_size=1, max_size=8),
       alias_ab=st.booleans(), alias_items=st.booleans(), alias_e=st.booleans())
def test_random_programs_with_aliasing_match_eager(stmts, alias_ab, alias_items, alias_e):
    src = "class Obj:\n    pass\n" + _program(stmts)
    differential(src, "f", _args(alias_ab, alias_items, alias_e), calls=2,
                 state=lambda g: (g["G"], g["CNT"]), compare_torch_count=False)

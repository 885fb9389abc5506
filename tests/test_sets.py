"""Sets and frozensets (variables/sets.py): constants fold, tensors/objects/modules by identity,
set algebra and methods, sets from the frame guarded on their contents and mutated through the
SideEffects table, iteration order exact or refused. Each case: ferrodyn vs eager (results and
mutated state after every call, iteration order included) and graph counts vs torch.compile."""

import textwrap

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from side_effects_harness import differential

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Obj:
    pass


def _objs(g, n=3):
    objs = [g["Obj"]() for _ in range(n)]
    for i, o in enumerate(objs):
        o.i = i  # distinguishable in the state snapshot
    return objs


PRELUDE = "class Obj:\n    pass\n"

CASES = {
    # name: (source, make_args) -- torch.compile captures each in one graph
    "constants_fold": ("""
        def f(x):
            a = {1, 2, 3}
            a.add(4); a.discard(1); a |= {10}
            b = frozenset([3, 4, 5])
            return x + len(a & b), sorted(a | b), a - b, a ^ b, a <= {2, 3, 4, 10, 11}, \\
                a.isdisjoint(b), 3 in a, a == {2, 3, 4, 10}, a
    """, lambda g: (torch.ones(2),)),
    "params_membership_in_loop": ("""
        def f(model, x):
            no_decay = {model[0].bias, model[1].bias}
            total = x.sum() * 0
            for p in model.parameters():
                if p in no_decay:
                    total = total + p.sum()
                else:
                    total = total + (p * p).sum()
            return total
    """, lambda g: (_seeded(lambda: torch.nn.Sequential(torch.nn.Linear(2, 2),
                                                         torch.nn.Linear(2, 2))),
                    torch.ones(2))),
    "modules_seen_set": ("""
        def f(model, x):
            seen = set()
            for m in model.modules():
                if m in seen:
                    continue
                seen.add(m)
                if isinstance(m, torch.nn.Linear):
                    x = m(x)
            return x, len(seen)
    """, lambda g: (_shared_seq(), torch.ones(2))),
    "existing_set_mutated": ("""
        def f(s, x):
            s.add(len(s) + 10)
            s.discard(1)
            if 2 in s:
                s.remove(2)
            s.update([7, 8])
            s -= {8}
            return x * len(s), 7 in s
    """, lambda g: ({1, 2, 3}, torch.ones(2))),
    "existing_set_set_operands": ("""
        def f(s, x):
            s |= {20, 21}
            s.intersection_update({20, 3, 21, 5})
            s ^= {5, 6}
            return x + len(s)
    """, lambda g: ({1, 2, 3, 5}, torch.ones(2))),
    "existing_set_of_objects": ("""
        def f(s, a, b, x):
            s.add(a)
            s.discard(b)
            return x + len(s), a in s, b in s
    """, lambda g: (lambda o: ({o[1], o[2]}, o[0], o[1], torch.ones(2)))(_objs(g))),
    "iterate_existing_set": ("""
        def f(s, x):
            for v in s:
                x = x * 2 + v
            return x
    """, lambda g: ({3, 1, 17, 9}, torch.ones(2))),
    "new_set_of_tensors_membership": ("""
        def f(x, y):
            s = {x, y}
            z = x * 2
            s.add(z)
            s.discard(y)
            return x + len(s), x in s, y in s, z in s
    """, lambda g: (torch.ones(2), torch.zeros(2))),
    "frozenset_key_and_member": ("""
        def f(fs, x):
            d = {fs: 1, frozenset({9}): 2}
            s = {fs, frozenset()}
            for v in fs:
                x = x + v
            return x, d[fs], fs in s, frozenset([2, 3]) == fs, len(s)
    """, lambda g: (frozenset({2, 3}), torch.ones(2))),
    "remove_missing_caught": ("""
        def f(s, x):
            try:
                s.remove(42)
            except KeyError:
                x = x + 1
            return x, len(s)
    """, lambda g: ({1}, torch.ones(2))),
    "pop_single_element": ("""
        def f(s, x):
            v = s.pop()
            return x + v, len(s)
    """, lambda g: ({5}, torch.ones(2))),
    "set_comprehension_and_unpack": ("""
        def f(xs, x):
            s = {v * 2 for v in xs}
            t = {*s, *xs, 99}
            return x + len(t), sorted(t), t
    """, lambda g: ([1, 2, 3, 2], torch.ones(2))),
    "return_set_with_history": ("""
        def f(x):
            s = set(range(20))
            s.difference_update(range(2, 20))
            s.add(9)
            return x + 1, s
    """, lambda g: (torch.ones(2),)),
}


def _seeded(make):
    torch.manual_seed(0)
    return make()


def _shared_seq():
    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 2)
    return torch.nn.Sequential(lin, torch.nn.ReLU(), lin)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sets_match_eager_and_torch_graph_count(name):
    src, make_args = CASES[name]
    differential(PRELUDE + textwrap.dedent(src), "f", make_args)


# torch.compile runs these eagerly (no graph: it does not model a set of tensors passed in);
# ferrodyn captures one graph, guarded on the members' identities
BEYOND_TORCH = {
    "existing_set_of_tensors": ("""
        def f(s, t, u, x):
            return x * len(s), t in s, u in s, (t * 2) in s
    """, lambda g: (lambda t, u: ({t}, t, u, torch.ones(2)))(torch.ones(2), torch.zeros(2))),
    "iterate_existing_set_of_tensors": ("""
        def f(s, x):
            n = 0
            for t in s:
                x = x + t
                n += 1
            return x, n
    """, lambda g: ({torch.ones(2), torch.full((2,), 3.0)}, torch.ones(2))),
}


@pytest.mark.parametrize("name", sorted(BEYOND_TORCH))
def test_sets_of_tensors_from_the_frame_one_graph(name):
    src, make_args = BEYOND_TORCH[name]
    out = differential(PRELUDE + textwrap.dedent(src), "f", make_args, compare_torch_count=False)
    assert (out["ferrodyn"][1], out["torch"][1]) == (1, 0)


# ---- refused where the model cannot be exact: still eager's values ---------------------------

REFUSED = {
    # name: (source, make_args, part of the refusal message)
    "iterate_new_tensor_set": ("""
        def f(x):
            out = x * 0
            for t in {x * 2, x * 3}:
                out = out * 2 + t
            return out
    """, lambda g: (torch.ones(2),), "set of tensors or objects"),
    "custom_hash_eq": ("""
        class K:
            def __init__(self, v):
                self.v = v
            def __hash__(self):
                return hash(self.v)
            def __eq__(self, other):
                return self.v == other.v
        def f(k, x):
            s = {k}
            return x + (1 if K(1) in s else 0)
    """, lambda g: (g["K"](1), torch.ones(2)), "set element"),
    "pop_several_existing": ("""
        def f(s, x):
            v = s.pop()
            return x + v
    """, lambda g: ({1, 9, 17}, torch.ones(2)), "set.pop"),
    "iterate_after_mutation": ("""
        def f(s, x):
            s.add(33)
            for v in s:
                x = x * 2 + v
            return x
    """, lambda g: ({1, 9}, torch.ones(2)), "after the frame mutated it"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_cases_keep_eager_values(name):
    src, make_args, reason = REFUSED[name]
    src = PRELUDE + textwrap.dedent(src)
    differential(src, "f", make_args, compare_torch_count=False)
    g = {"torch": torch}
    exec(compile(src, "<refused>", "exec"), g)
    out = ferrodyn.explain(g["f"])(*make_args(g))
    assert any(reason in r for r in out.break_reasons), out.break_reasons


# ---- guards --------------------------------------------------------------------------------

def _compiled(src):
    g = {"torch": torch}
    exec(compile(textwrap.dedent(src), "<guards>", "exec"), g)
    cb = CountingBackend()
    return g["f"], ferrodyn.compile(g["f"], backend=cb), cb


def test_contents_of_a_set_argument_are_guarded():
    f, cf, cb = _compiled("""
        def f(s, x):
            return x + (1 if 2 in s else 0) + len(s)
    """)
    for s in ({1, 2}, {1, 3}, {1, 2}, {1, 2, 3}):
        torch.testing.assert_close(cf(s, torch.ones(2)), f(s, torch.ones(2)))
    assert cb.count == 3  # {1, 2} hits its entry the second time


def test_iteration_order_of_a_set_argument_is_guarded():
    """Two equal sets that iterate in different orders (their histories differ)."""
    s1 = set([2, 3, 4, 10])
    s2 = {1, 2, 3}
    s2.add(4)
    s2.discard(1)
    s2 |= {10}  # a bigger table: 10 no longer collides with 2
    assert s1 == s2 and list(s1) != list(s2)  # the precondition of the test
    f, cf, cb = _compiled("""
        def f(s, x):
            out = []
            for v in s:
                x = x * 2 + v
                out.append(v)
            return x, out
    """)
    for s in (s1, s2, s1):
        want, got = f(s, torch.ones(2)), cf(s, torch.ones(2))
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]
    assert cb.count == 2


def test_identity_of_set_members_is_guarded():
    """Membership by identity compiled for one tensor is not reused for another."""
    f, cf, cb = _compiled("""
        def f(s, t, x):
            return x + (1 if t in s else 2)
    """)
    a, b = torch.ones(2), torch.ones(2)
    for s, t in (({a}, a), ({a}, b), ({b}, b), ({a}, a)):
        torch.testing.assert_close(cf(s, t, torch.ones(2)), f(s, t, torch.ones(2)))


def test_tensor_equal_values_are_not_members():
    """`t2 in {t}` with an equal-valued but different tensor is False (hash by identity)."""
    f, cf, cb = _compiled("""
        def f(t, u):
            s = {t}
            return (u in s), (t in s), u + 1
    """)
    t, u = torch.ones(2), torch.ones(2)
    assert cf(t, u)[:2] == f(t, u)[:2] == (False, True)
    assert cb.count == 1


def test_set_mutation_is_flushed_at_a_graph_break():
    src = """
        def f(s, x):
            s.add(5)
            x = x + 1
            torch._dynamo.graph_break()
            seen = sorted(s)
            s.discard(1)
            return x * len(s), seen
    """
    differential(textwrap.dedent(src), "f", lambda g: ({1, 2}, torch.ones(2)))


def test_optimizer_style_param_groups_one_graph():
    """torch.optim-like code: a set of parameter ids deduplicates groups, membership tested in
    a loop over parameters; one graph like torch.compile."""
    src = """
        def f(model, x):
            seen = set()
            total = x.sum() * 0
            groups = [list(model.parameters()), [model[0].weight]]
            for group in groups:
                for p in group:
                    if p in seen:
                        continue
                    seen.add(p)
                    total = total + (p * x.sum()).sum()
            return total, len(seen)
    """
    out = differential(textwrap.dedent(src), "f",
                       lambda g: (_seeded(lambda: torch.nn.Sequential(torch.nn.Linear(2, 2))),
                                  torch.ones(2)))
    assert out["ferrodyn"][1] == 1

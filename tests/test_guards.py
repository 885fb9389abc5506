"""Guard trees (rust/guards): every accessor and non-tensor leaf, true and false, with its
explanation, on a mapping and on argument slots; deduplication, ordering, failure semantics."""

import collections
import gc
import re
import weakref

import pytest

from ferrodyn import _C


def both(tree, values, names=("x", "y", "z"), **kw):
    """check() and explain() on a mapping, a tuple and a list of slots: all must agree."""
    names = names[: len(values)]
    results = {tree.check(dict(zip(names, values)), **kw), tree.check(tuple(values), **kw),
               tree.check(list(values), **kw)}
    assert len(results) == 1
    expl = {tree.explain(dict(zip(names, values)), **kw), tree.explain(tuple(values), **kw)}
    assert len(expl) == 1
    (ok,), (why,) = results, expl
    assert (why is None) == ok
    return ok, why


def tree_on_x(add_leaf, **builder_kw):
    b = _C.GuardBuilder(**builder_kw)
    add_leaf(b, b.local(0, "x"))
    return b.build()


class Obj:
    pass


SENTINEL = Obj()
SKIP = object()  # no passing value in the table (tested separately)

# (id, leaf adder, a passing value, a failing value, the explanation of the failure (regex))
class _DictSub(dict):
    pass


def _moved_to_end(d, key):
    d.move_to_end(key)
    return d


LEAVES = [
    ("type_is", lambda b, n: b.type_is(n, int), 3, "a", r"type\(L\['x'\]\) is int \(got str\)"),
    ("type_is bool is not int", lambda b, n: b.type_is(n, int), 3, True, r"type\(L\['x'\]\) is int \(got bool\)"),
    ("is_", lambda b, n: b.is_(n, SENTINEL), SENTINEL, Obj(),
     r"L\['x'\] is <Obj object at 0x[0-9a-f]+> \(got <Obj object at 0x[0-9a-f]+>\)"),
    ("is_ int", lambda b, n: b.is_(n, 2**80), SKIP, 2**80 + 1, r"L\['x'\] is 1208925819614629174706176 \(got 1208925819614629174706177\)"),
    ("is_none", lambda b, n: b.is_none(n), None, 0, r"L\['x'\] is None \(got 0\)"),
    ("is_not_none", lambda b, n: b.is_not_none(n), 0, None, r"L\['x'\] is not None$"),
    ("equals int", lambda b, n: b.equals(n, 3), 3, 4, r"L\['x'\] == 3 \(got 4\)"),
    ("equals int is not bool", lambda b, n: b.equals(n, 1), 1, True, r"L\['x'\] == 1 \(got True\)"),
    ("equals bool is not int", lambda b, n: b.equals(n, True), True, 1, r"L\['x'\] == True \(got 1\)"),
    ("equals float is not int", lambda b, n: b.equals(n, 1.0), 1.0, 1, r"L\['x'\] == 1.0 \(got 1\)"),
    ("equals -0.0", lambda b, n: b.equals(n, -0.0), -0.0, 0.0, r"L\['x'\] == -0.0 \(got 0.0\)"),
    ("equals nan", lambda b, n: b.equals(n, float("nan")), float("nan"), 1.5, r"L\['x'\] == nan \(got 1.5\)"),
    ("equals big int", lambda b, n: b.equals(n, 2**70), 2**70, 2**70 + 1, r"L\['x'\] == 1180591620717411303424 \(got 1180591620717411303425\)"),
    ("equals str", lambda b, n: b.equals(n, "héllo"), "héllo", "hello", r"L\['x'\] == 'héllo' \(got 'hello'\)"),
    ("equals bytes", lambda b, n: b.equals(n, b"ab"), b"ab", "ab", r"L\['x'\] == b'ab' \(got 'ab'\)"),
    ("equals None", lambda b, n: b.equals(n, None), None, False, r"L\['x'\] == None \(got False\)"),
    ("equals nested tuple", lambda b, n: b.equals(n, (1, ("a", None), 2.5)), (1, ("a", None), 2.5), (1, ("a", 0), 2.5),
     r"L\['x'\] == \(1, \('a', None\), 2.5\) \(got \(1, \('a', 0\), 2.5\)\)"),
    ("equals tuple is not list", lambda b, n: b.equals(n, (1, 2)), (1, 2), [1, 2],
     r"L\['x'\] == \(1, 2\) \(got an object of type list\)"),
    ("length_is", lambda b, n: b.length_is(n, 2), [1, 2], (1,), r"len\(L\['x'\]\) == 2 \(got 1\)"),
    ("length_is no len", lambda b, n: b.length_is(n, 2), "ab", 5, r"len\(L\['x'\]\) == 2 \(got an object of type int without len\(\)\)"),
    ("dict_keys", lambda b, n: b.dict_keys(n, ["a", "b"]), {"a": 1, "b": 2}, {"b": 2, "a": 1},
     r"list\(L\['x'\].keys\(\)\) == \['a', 'b'\] \(got \['b', 'a'\]\)"),
    # dict subclasses are checked in their own key order (OrderedDict keeps its own, apart from
    # the underlying dict's: move_to_end changes only the former)
    ("dict_keys OrderedDict", lambda b, n: b.dict_keys(n, ["a", "b"]), collections.OrderedDict(a=1, b=2),
     _moved_to_end(collections.OrderedDict(a=1, b=2), "a"),
     r"list\(L\['x'\].keys\(\)\) == \['a', 'b'\] \(got \['b', 'a'\]\)"),
    ("dict_keys dict subclass", lambda b, n: b.dict_keys(n, ["a"]), _DictSub(a=1), _DictSub(b=1),
     r"list\(L\['x'\].keys\(\)\) == \['a'\] \(got \['b'\]\)"),
    ("dict_keys not a mapping", lambda b, n: b.dict_keys(n, ["a"]), {"a": 1}, 5,
     r"list\(L\['x'\].keys\(\)\) == \['a'\] \(got an object of type int\)"),
]


@pytest.mark.parametrize("add_leaf, good, bad, why", [x[1:] for x in LEAVES], ids=[x[0] for x in LEAVES])
def test_leaf_true_and_false_with_explanation(add_leaf, good, bad, why):
    tree = tree_on_x(add_leaf)
    assert len(tree) == 1
    if good is not SKIP:
        assert both(tree, [good]) == (True, None)
    ok, expl = both(tree, [bad])
    assert not ok
    assert re.fullmatch(why, expl), expl


def test_is_big_int_identity_passes_for_the_same_object():
    big = 2**80
    tree = tree_on_x(lambda b, n: b.is_(n, big))
    assert tree.check((big,))


def test_equals_rejects_non_constants_naming_the_value():
    b = _C.GuardBuilder()
    with pytest.raises(TypeError, match=r"\[1, 2\] of type list"):
        b.equals(b.local(0, "x"), [1, 2])
    with pytest.raises(TypeError, match=r"of type Obj"):
        b.equals(b.local(0, "x"), (1, Obj()))


def test_is_holds_weakly_and_fails_once_the_object_died():
    o = Obj()
    r = weakref.ref(o)
    tree = tree_on_x(lambda b, n: b.is_(n, o))
    assert tree.check((o,))
    del o
    gc.collect()
    assert r() is None, "the guard kept the object alive"
    other = Obj()
    assert not tree.check((other,))
    assert tree.explain((other,)).endswith("(the object has died)")


# -- accessors ----------------------------------------------------------------------------


def test_local_missing_fails_without_raising():
    tree = tree_on_x(lambda b, n: b.type_is(n, int))
    assert not tree.check({})
    assert not tree.check(())
    assert tree.explain({"y": 1}) == "type(L['x']) is int (L['x'] could not be read)"


def test_local_reads_by_index_from_slots_and_by_name_from_mappings():
    b = _C.GuardBuilder()
    b.equals(b.local(1, "y"), "second")
    tree = b.build()
    assert tree.check((0, "second")) and tree.check({"y": "second"})
    assert not tree.check(("second", 0))
    assert tree.explain({"y": "first"}) == "L['y'] == 'second' (got 'first')"


def test_local_from_a_non_dict_mapping():
    class M(collections.abc.Mapping):
        def __init__(self, d):
            self.d = d

        def __getitem__(self, k):
            return self.d[k]

        def __iter__(self):
            return iter(self.d)

        def __len__(self):
            return len(self.d)

    tree = tree_on_x(lambda b, n: b.equals(n, 5))
    assert tree.check(M({"x": 5}))
    assert not tree.check(M({"x": 6}))
    assert not tree.check(M({}))


FLAG = True


def test_global_reads_builder_globals_unless_check_passes_others():
    b = _C.GuardBuilder(globals())
    g = b.global_("FLAG")
    assert g.source == "G['FLAG']"
    b.equals(g, True)
    tree = b.build()
    assert tree.check(())
    assert not tree.check((), {"FLAG": False})
    assert tree.explain((), {"FLAG": False}) == "G['FLAG'] == True (got False)"
    assert tree.explain((), {}) == "G['FLAG'] == True (G['FLAG'] could not be read)"
    assert _C.GuardBuilder().build().check(()) is True  # an empty tree passes


def test_global_without_any_globals_fails():
    b = _C.GuardBuilder()
    b.is_not_none(b.global_("FLAG"))
    assert not b.build().check(())


def test_builtin_defaults_to_the_builtins_module():
    b = _C.GuardBuilder(globals())
    n = b.builtin("len")
    assert n.source == "B['len']"
    b.is_(n, len)
    tree = b.build()
    assert tree.check(())
    assert not tree.check((), None, {"len": abs})
    assert not tree.check((), None, {})
    assert tree.explain((), None, {}) == (
        "B['len'] is <builtin_function_or_method object at %#x> (B['len'] could not be read)" % id(len))


def _cells():
    a = 5

    def f():
        return a, b  # noqa: F821 - b is assigned later (empty cell until then)

    cells = f.__closure__
    b = 1  # noqa: F841
    return f.__code__.co_freevars, cells


def test_closure_cell_contents_and_empty_cells():
    names, cells = _cells()
    bld = _C.GuardBuilder()
    c = bld.closure_cell(names.index("a"), "a")
    assert c.source == "C['a']"
    bld.equals(c, 5)
    tree = bld.build()
    assert tree.check((), closure=cells)
    assert not tree.check(())  # no closure given
    empty = (type(cells[0])(),) * 2
    assert not tree.check((), closure=empty)
    assert tree.explain((), closure=empty) == "C['a'] == 5 (C['a'] could not be read)"


class WithProps:
    def __init__(self):
        self.a = 1
        self.getattr_calls = 0

    @property
    def boom(self):
        raise RuntimeError("user code raised")

    def __getattr__(self, name):
        if name == "dyn":
            self.getattr_calls += 1
            return "dynamic"
        raise AttributeError(name)


def test_attr_reads_and_fails_on_missing_or_raising_attributes():
    b = _C.GuardBuilder()
    x = b.local(0, "x")
    a = b.attr(x, "a")
    assert a.source == "L['x'].a"
    b.equals(a, 1)
    tree = b.build()
    o = WithProps()
    assert both(tree, [o]) == (True, None)
    o.a = 2
    assert both(tree, [o]) == (False, "L['x'].a == 1 (got 2)")
    del o.a
    assert both(tree, [o]) == (False, "L['x'].a == 1 (L['x'].a could not be read)")

    b = _C.GuardBuilder()
    b.is_none(b.attr(b.local(0, "x"), "boom"))
    tree = b.build()
    assert tree.check((WithProps(),)) is False  # the RuntimeError counts as failure
    assert tree.explain((WithProps(),)) == "L['x'].boom is None (L['x'].boom could not be read)"


class GetItem:
    def __getitem__(self, k):
        if k == "missing":
            raise KeyError(k)
        return ("got", k)


@pytest.mark.parametrize("container, key, value", [
    ([10, 20, 30], 1, 20), ([10, 20, 30], -1, 30), ((10, 20), 0, 10), ({"k": 7}, "k", 7),
    ({1: "one"}, 1, "one"), ({(1, 2): "t"}, (1, 2), "t"), (GetItem(), "q", ("got", "q")),
])
def test_item_reads(container, key, value):
    b = _C.GuardBuilder()
    n = b.item(b.local(0, "x"), key)
    assert n.source == f"L['x'][{key!r}]"
    b.equals(n, value)
    assert both(b.build(), [container]) == (True, None)


@pytest.mark.parametrize("container, key", [
    ([10, 20], 2), ([10, 20], -3), ((), 0), ({"k": 7}, "j"), (GetItem(), "missing"), (5, 0), ({}, 0),
])
def test_item_missing_fails(container, key):
    b = _C.GuardBuilder()
    n = b.item(b.local(0, "x"), key)
    b.is_not_none(n)
    ok, why = both(b.build(), [container])
    assert not ok
    assert why == f"L['x'][{key!r}] is not None (L['x'][{key!r}] could not be read)"


def test_item_bool_key_is_not_an_index():
    # True == 1 but a dict keyed by True; the list path must not take bools as indices.
    b = _C.GuardBuilder()
    b.equals(b.item(b.local(0, "x"), True), "t")
    tree = b.build()
    assert tree.check(({True: "t"},))


def test_dict_of_reads_the_instance_dict_without_getattr():
    o = WithProps()
    o.__dict__["dyn"] = "stored"
    b = _C.GuardBuilder()
    d = b.dict_of(b.local(0, "x"))
    assert d.source == "L['x'].__dict__"
    b.dict_keys(d, ["a", "getattr_calls", "dyn"])
    b.equals(b.item(d, "dyn"), "stored")
    tree = b.build()
    assert both(tree, [o]) == (True, None)
    assert o.getattr_calls == 0
    ok, why = both(tree, [5])
    assert not ok and why.endswith("(L['x'].__dict__ could not be read)")


def test_type_of_and_len_of():
    b = _C.GuardBuilder()
    x = b.local(0, "x")
    t = b.type_of(x)
    n = b.len_of(x)
    assert (t.source, n.source) == ("type(L['x'])", "len(L['x'])")
    b.is_(t, list)
    b.equals(n, 3)
    tree = b.build()
    assert both(tree, [[1, 2, 3]]) == (True, None)
    assert both(tree, [[1, 2]]) == (False, "len(L['x']) == 3 (got 2)")
    assert both(tree, [(1, 2, 3)]) == (False, "type(L['x']) is list (got tuple)")


# -- tree structure -----------------------------------------------------------------------


def test_accessors_are_deduplicated():
    b = _C.GuardBuilder()
    x1, x2 = b.local(0, "x"), b.local(0, "x")
    a1, a2 = b.attr(x1, "a"), b.attr(x2, "a")
    i1, i2 = b.item(a1, 1), b.item(a2, 1)
    ib = b.item(a1, True)  # True == 1 but a different key
    assert x1.source == x2.source and a1.source == a2.source and i1.source == i2.source
    for n in (x1, x2, a1, a2, i1, i2, ib):
        b.is_not_none(n)
    tree = b.build()
    assert repr(tree) == "<GuardTree: 7 leaves on 4 accessors>"


def test_leaves_are_ordered_cheap_first():
    b = _C.GuardBuilder()
    x, y = b.local(0, "x"), b.local(1, "y")
    b.equals(x, 1)
    b.length_is(y, 2)
    b.type_is(b.attr(y, "a"), int)
    b.global_state()
    b.type_is(y, list)
    b.is_not_none(x)
    leaves = b.build().leaves()
    assert leaves[:3] == ["type(L['y']) is list", "L['x'] is not None", "type(L['y'].a) is int"]
    assert leaves[3:5] == ["L['x'] == 1", "len(L['y']) == 2"]
    assert leaves[5].startswith("global_state(")


def test_first_failure_stops_evaluation():
    class Counting:
        reads = 0

        @property
        def a(self):
            Counting.reads += 1
            return 1

    b = _C.GuardBuilder()
    x = b.local(0, "x")
    b.equals(b.attr(x, "a"), 1)
    b.type_is(b.local(1, "y"), int)
    tree = b.build()
    assert not tree.check((Counting(), "not an int"))
    assert Counting.reads == 0  # the type leaf (cheaper class) failed first
    assert tree.check((Counting(), 1)) and Counting.reads == 1


def test_builder_is_single_use_and_nodes_belong_to_it():
    b = _C.GuardBuilder()
    x = b.local(0, "x")
    b.build()
    with pytest.raises(ValueError, match="already built"):
        b.local(1, "y")
    with pytest.raises(ValueError, match="already built"):
        b.build()
    b2 = _C.GuardBuilder()
    with pytest.raises(ValueError, match="another GuardBuilder"):
        b2.is_none(x)


def test_type_is_needs_a_type():
    b = _C.GuardBuilder()
    with pytest.raises(TypeError, match="needs a type"):
        b.type_is(b.local(0, "x"), 3)


def test_no_reference_leaks_on_success_failure_and_explain():
    import sys

    import torch

    class M:
        pass

    m = M()
    m.p = {"w": torch.randn(2)}
    t = torch.randn(3)
    b = _C.GuardBuilder(globals())
    x, y = b.local(0, "x"), b.local(1, "y")
    b.tensor_match(x, t)
    b.type_is(y, M)
    w = b.item(b.item(b.dict_of(y), "p"), "w")
    b.tensor_match(w, m.p["w"])
    b.equals(b.tensor_size(w, 0), 2)
    b.is_not_none(b.global_("FLAG"))
    tree = b.build()
    good, bad = (t, m), (torch.randn(4), m)
    objs = [t, m, m.p, m.p["w"], FLAG]
    before = [sys.getrefcount(o) for o in objs]
    for _ in range(2000):
        assert tree.check(good) and tree.check({"x": t, "y": m})
        assert not tree.check(bad)
        assert tree.explain(bad) is not None
    assert [sys.getrefcount(o) for o in objs] == before

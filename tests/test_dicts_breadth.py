"""Dicts in the shapes model code uses (variables/dicts.py, dict_keys.py, dict_views.py,
dict_objects.py): defaultdicts made in the frame, `fromkeys`, dicts keyed by tensors,
parameters and frozen dataclass instances, OrderedDict reordering, `|` between dict kinds,
set operations on keys views, mappingproxies made in the frame. Each case is compared with
eager (results, their types and the state mutated) and with torch.compile's graph count."""

import collections
import copy
import dataclasses
import operator
import types
from collections import OrderedDict, defaultdict

import pytest
import torch

import ferrodyn
from compiled_vs_eager import run_all
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def one_graph_like_torch(fn, *args):
    want, got, fd, tc = run_all(fn, *args)
    ferrodyn.reset()
    reasons = ferrodyn.explain(fn)(*copy.deepcopy(args)).break_reasons
    assert reasons == [], reasons
    assert fd == 1 and tc <= 1, (fd, tc)
    return want, got


# ---- defaultdict made in the frame ---------------------------------------------------------

def dd_list_factory(x):
    d = defaultdict(list)
    d["a"].append(x + 1)
    d["b"] = x * 2
    d["a"].append(x)
    return d, d.default_factory, type(d) is defaultdict


def dd_no_factory_raises_key_error(x):
    d = defaultdict()
    try:
        d[1] += 42
    except KeyError:
        d[1] = 1
    return x + 1, dict(d)


def dd_none_factory_with_items(x):
    d = defaultdict(None, {1: 10})
    d[1] += 42
    try:
        d[2] += 24
    except KeyError as e:
        d[2] = e.args[0]
    return x + 1, d


def dd_int_counter(x):
    counts = defaultdict(int, a=1, b=2)
    for k in ["a", "c", "a", "d"]:
        counts[k] += 1
    assert isinstance(counts, defaultdict)
    return x * counts["a"] + counts["zz"], counts


def dd_lambda_factory_and_update(x):
    dd = defaultdict(lambda: dict())  # noqa: C408
    dd["a"] = x + 1
    dd["c"] = x * 2
    dd.update({"b": x * 3})
    dd.update([["d", x - 2], ("e", x + 2)])
    dd["f"]["g"] = x
    return dd["b"], dict(dd)


def dd_iterate_and_copy(x):
    d = defaultdict(list)
    d[0] = 42
    for k in d:
        d[k] += 1
    c = d.copy()
    c[5].append(x)
    return x + 1, d, c, c.default_factory is list


def dd_with_dict_and_kwargs(x):
    d = dict([("a", 1), ("b", 2)], c=3)
    dd = defaultdict(list, d, d=4, e=5)
    dd["x"].append(42)
    return x + 1, d, dd


@pytest.mark.parametrize("fn", [dd_list_factory, dd_no_factory_raises_key_error,
                                dd_none_factory_with_items, dd_int_counter,
                                dd_lambda_factory_and_update, dd_iterate_and_copy,
                                dd_with_dict_and_kwargs])
def test_defaultdict_made_in_frame(fn):
    want, got = one_graph_like_torch(fn, torch.randn(3))
    for w, g in zip(want, got):  # the type and the factory of every defaultdict returned
        if isinstance(w, defaultdict):
            assert type(g) is defaultdict and g.default_factory is w.default_factory \
                or (callable(w.default_factory) and g.default_factory() == w.default_factory())


def test_defaultdict_factory_must_be_callable():
    def fn(x):
        return defaultdict(3), x + 1
    run_all(fn, torch.randn(3))  # eager's TypeError


# ---- fromkeys ------------------------------------------------------------------------------

def fromkeys_kinds(x, y):
    lst = ["a", "b"]
    d = dict.fromkeys(lst)
    d1 = dict.fromkeys(d, x + 1)
    d2 = collections.defaultdict.fromkeys(iter(d1), x - 2)
    d3 = collections.OrderedDict.fromkeys(tuple(lst), value=y)
    return d1["a"] * d2["b"] + d2["a"] + d1["b"] + d3["a"] + d3["b"] + 1, d, d2, d3


def test_fromkeys():
    want, got = one_graph_like_torch(fromkeys_kinds, torch.randn(3), torch.randn(3))
    assert type(got[2]) is defaultdict and got[2].default_factory is None
    assert got[3]["a"] is got[3]["b"]  # one value object for every key, as eager


# ---- keys that are not constants -----------------------------------------------------------

_PARAM = torch.nn.Parameter(torch.ones(3))


def param_key(a):
    tmp = {"a": a, _PARAM: 3}
    return tmp["a"] + tmp[_PARAM]


def test_parameter_as_key():
    one_graph_like_torch(param_key, torch.randn(3))


def tensor_keys_returned(a, b):
    d = {a: a + 1, b: 2}
    d[a] = d[a] * d[b]
    return d


def test_tensor_keys_returned_are_the_input_objects():
    compiled = ferrodyn.compile(tensor_keys_returned, backend=CountingBackend())
    a, b = torch.randn(3), torch.randn(3)
    want, got = tensor_keys_returned(a, b), compiled(a, b)
    assert [k is a or k is b for k in got] == [True, True]
    assert list(map(id, got)) == list(map(id, want))
    assert all(torch.equal(torch.as_tensor(want[k]), torch.as_tensor(got[k])) for k in want)


def keys_by_identity(x, a, b):
    d = {a: 1, b: 2}
    return x * d[a] + len(d)


def test_tensor_keys_guard_identity():
    """`{a: 1, b: 2}` has one key when a is b: the graph traced for two tensors must not run
    for one tensor passed twice (the aliasing guard recompiles)."""
    backend = CountingBackend()
    compiled = ferrodyn.compile(keys_by_identity, backend=backend)
    x, a, b = torch.randn(3), torch.randn(3), torch.randn(3)
    for args in ((x, a, b), (x, a, b), (x, a, a), (x, b, a)):
        assert torch.equal(compiled(*args), keys_by_identity(*args))
    assert backend.count == 2


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int
    tag: str = dataclasses.field(default="", compare=False)


def frozen_dataclass_keys(t):
    p1, p2 = Point(1, 2), Point(3, 4, "b")
    d = {p1: t * 2, p2: t * 3}
    d[Point(1, 2, "other")] = d[Point(1, 2)] + 1  # equal key: the first key object stays
    return d[Point(1, 2)] + d[Point(3, 4)], len(d), [k.tag for k in d]


def test_frozen_dataclass_keys():
    one_graph_like_torch(frozen_dataclass_keys, torch.randn(3))


@dataclasses.dataclass(frozen=True)
class OwnEq:
    x: int

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


def user_eq_keys(t):
    d = {OwnEq(1): t}
    return d[OwnEq(2)] + 1  # equal by the user's __eq__


def test_user_hash_eq_key_is_not_guessed():
    _, _, fd, _ = run_all(user_eq_keys, torch.randn(3))
    reasons = ferrodyn.explain(user_eq_keys)(torch.randn(3)).break_reasons
    assert any("user code" in str(r) for r in reasons), reasons


# ---- OrderedDict reordering ----------------------------------------------------------------

def od_reorder_new(x):
    d = OrderedDict(a=x, b=2, c=3)
    d.move_to_end("a")
    d.move_to_end("c", last=False)
    k, v = d.popitem()
    k2, v2 = d.popitem(last=False)
    return d, k, v * 2, k2, v2


def od_reorder_existing(x, d):
    d.move_to_end("a")
    d["z"] = x
    d.move_to_end("b", last=False)
    return x + d["a"]


def od_move_missing(x, d):
    try:
        d.move_to_end("nope")
    except KeyError as e:
        return x + 1, e.args[0]
    return x


def test_ordered_dict_reordering_new():
    want, got = one_graph_like_torch(od_reorder_new, torch.randn(3))
    assert type(got[0]) is OrderedDict


def test_ordered_dict_reordering_existing_is_replayed():
    d_eager, d_comp = OrderedDict(a=1, b=2, c=3), OrderedDict(a=1, b=2, c=3)
    x = torch.randn(3)
    compiled = ferrodyn.compile(od_reorder_existing, backend=CountingBackend())
    assert torch.equal(compiled(x, d_comp), od_reorder_existing(x, d_eager))
    assert list(d_comp) == list(d_eager) == ["b", "c", "a", "z"]
    assert d_comp["z"] is x


def test_ordered_dict_move_to_end_missing_key():
    run_all(od_move_missing, torch.randn(3), OrderedDict(a=1))


def dict_popitem_empty(x):
    d = {"a": x}
    d.popitem()
    try:
        d.popitem()
    except KeyError as e:
        return x + 1, e.args[0]
    return x


def test_popitem():
    one_graph_like_torch(dict_popitem_empty, torch.randn(3))


# ---- | between dict kinds, dict() keywords ---------------------------------------------------

def union_types(x):
    def_dict = defaultdict(int, {1: x, 2: 2})
    ord_dict = OrderedDict({3: 3, 4: 4})
    base_dict = {5: 5, 6: 6}
    rs = (def_dict | ord_dict, def_dict | base_dict, base_dict | def_dict, ord_dict | def_dict,
          base_dict | ord_dict, base_dict | base_dict, ord_dict.__ror__(base_dict))
    def_dict |= [(0, "zero"), (1, "one")]
    return [(type(r).__name__, list(r)) for r in rs], rs[2].default_factory, def_dict, x + 1


def test_union_result_type_and_factory():
    want, got = one_graph_like_torch(union_types, torch.randn(3))


def dict_keywords_named_like_parameters(x):
    d = dict(arg={"a": 1}, tx=2)
    e = {}
    e.update(other={"b": 2}, d=3)
    o = OrderedDict(arg=4)
    return x + 1, d, e, o


def test_dict_keywords_named_like_parameters():
    """`dict(arg=v)` is the key 'arg' (was read as the positional argument: a wrong value)."""
    one_graph_like_torch(dict_keywords_named_like_parameters, torch.randn(3))


# ---- set operations on keys views ------------------------------------------------------------

@pytest.mark.parametrize("op", [operator.or_, operator.and_, operator.sub, operator.xor])
def test_keys_view_set_operations(op):
    def fn(x):
        a = {"one": x, "two": 2, "four": 4, "five": 5, "six": 6}
        b = {"one": 1, "three": 3, "six": 6}
        r1, r2 = op(a.keys(), b.keys()), op(b.keys(), a.keys())
        r3 = op(a.keys(), {"one", "seven"})
        return type(r1).__name__, list(r1), list(r2), list(r3), x + len(r1)
    one_graph_like_torch(fn, torch.randn(3))


def keys_union_loop(inputs_a, inputs_b):
    total = torch.zeros(1)
    for k in sorted(inputs_a.keys() | inputs_b.keys()):
        if k in inputs_a:
            total += inputs_a[k]
        if k in inputs_b:
            total += inputs_b[k]
    return total


def test_keys_union_of_input_dicts():
    v1, v2 = torch.tensor([100.0]), torch.tensor([200.0])
    one_graph_like_torch(keys_union_loop, {"a": v1, "b": v2}, {"b": v1, "c": v2})


# ---- mappingproxy made in the frame ------------------------------------------------------------

def proxy_of_local(x):
    d = {"a": 2, "b": 3, "c": 5 * x}
    mp = types.MappingProxyType(d)
    y = torch.sin(x * mp["a"])
    for v in mp.values():
        y += torch.cos(x * v)
    d["z"] = 1  # seen through the proxy
    return mp, y, len(mp), "z" in mp


def test_mappingproxy_of_local_dict():
    def fn(x):  # the proxy's contents compared as a dict (a proxy's == compares tensors)
        mp, *rest = proxy_of_local(x)
        return type(mp), dict(mp), *rest
    one_graph_like_torch(fn, torch.randn(3))
    mp = ferrodyn.compile(proxy_of_local, backend=CountingBackend())(torch.randn(3))[0]
    assert type(mp) is types.MappingProxyType and list(mp) == ["a", "b", "c", "z"]


SHARED = {"a": 2, "b": 3}


def proxy_of_global(x):
    mp = types.MappingProxyType(SHARED)
    y = x * mp["a"]
    SHARED["d"] = 4
    return mp, y, len(mp)


def test_mappingproxy_of_existing_dict_stays_live():
    compiled = ferrodyn.compile(proxy_of_global, backend=CountingBackend())
    x = torch.randn(3)
    mp, y, n = compiled(x)
    assert n == 3 and torch.equal(y, x * 2)
    SHARED["e"] = 5  # the returned proxy is a view of the real dict
    assert list(mp) == ["a", "b", "d", "e"]
    del SHARED["d"], SHARED["e"]


def view_mapping(x):
    d = {}
    m = d.keys().mapping
    d["foo"] = x
    return torch.sin(x), isinstance(m, types.MappingProxyType), dict(m), m == d


def test_view_mapping_reflects_mutation():
    one_graph_like_torch(view_mapping, torch.randn(3))


def test_mappingproxy_is_read_only():
    def fn(x):
        mp = types.MappingProxyType({"a": 1})
        try:
            mp["b"] = 2
        except TypeError:
            return x + 1
        return x
    run_all(fn, torch.randn(3))


# ---- lazy key guarding: one key's lookup guards that key, not the whole key set -----------

CFG = {"a": 2, "b": 3, "c": 5}


def read_cfg(x):
    y = x * CFG["a"] + CFG.get("b", 0)
    return y if "zz" not in CFG else y + 1


def test_lookup_guards_only_its_key():
    backend = CountingBackend()
    compiled = ferrodyn.compile(read_cfg, backend=backend)
    x = torch.randn(3)
    snapshot = dict(CFG)
    try:
        steps = [lambda: None,
                 lambda: (CFG.pop("c"), CFG.__setitem__("d", 10)),  # keys not read: no recompile
                 lambda: CFG.__setitem__("a", 7),                  # a read value: recompile
                 lambda: CFG.__setitem__("zz", 1),                 # an absent key appears
                 lambda: CFG.pop("b")]                             # a read key goes
        counts = []
        for change in steps:
            change()
            assert torch.equal(compiled(x), read_cfg(x))
            counts.append(backend.count)
        assert counts == [1, 1, 2, 3, 4], counts
    finally:
        CFG.clear()
        CFG.update(snapshot)


def iterate_cfg(x, d):
    for k in d:
        x = x + d[k]
    return x


def test_iteration_guards_the_key_set():
    backend = CountingBackend()
    compiled = ferrodyn.compile(iterate_cfg, backend=backend)
    x = torch.randn(3)
    for d in ({"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, {"b": 2, "a": 1}):
        assert torch.equal(compiled(x, d), iterate_cfg(x, d))
    assert backend.count == 3


def keys_compared_with_sets(x, d):
    same = d.keys() == {"w", "b"}
    other = {"w"} == d.keys()
    return x + 1 if same and not other else x - 1


def test_keys_view_equals_set():
    one_graph_like_torch(keys_compared_with_sets, torch.randn(3), {"w": 1, "b": 2})

"""ferrodyn.make_fx: every kind of result pytree comes back from the traced graph as eager returns
it (same types, equal values), in real, fake and symbolic modes, and the graph's ops are torch's
make_fx's. Symbolic graphs are also run on inputs of other sizes.

The kinds: torch.return_types, torch.Size (holding SymInts in symbolic mode), dtypes, devices,
layouts, memory formats, tuples/lists/dicts/namedtuples/OrderedDicts nested, None, Python
scalars (including -0.0, nan, inf, complex), SymInt/SymFloat/SymBool, and other constant objects
(slices, ranges, enums, a user object: the graph returns that very object)."""

import collections
import enum
import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx as torch_make_fx

from ferrodyn.proxy_dispatch import make_fx

MODES = ["real", "fake", "symbolic"]

Pair = collections.namedtuple("Pair", "first second")


class Color(enum.Enum):
    RED = 1


MARKER = object()


def return_types_with_others(x):
    return torch.max(x, 1), x + 1, x.dtype


def return_types_alone(x):
    return torch.topk(x, 2, dim=0)


def return_types_nested(x):
    return {"sorted": x.sort(dim=1), "n": x.shape[0]}, [x.min(0)]


def size_of_new_tensor(x):
    return x.new_zeros(x.shape[0], 3).size()


def sizes_with_tensor(x):
    return x.shape, x.view(-1).shape, x.sum(0), x.new_ones(2, 2).shape


def torch_enums(x):
    return x.dtype, x.device, torch.strided, torch.channels_last, x * 2, torch.int64


def nested_containers(x):
    return [x, (x * 2, {"a": x.shape, "b": [x.sum(), (x.dtype,)], 3: x[0]})]


def namedtuples_and_ordered(x):
    od = collections.OrderedDict([("z", x + 1), ("a", x.shape[1])])
    return Pair(x.cos(), Pair(x.shape[0], od)), collections.defaultdict(list, {"k": [x]})


def nones(x):
    return None, (x, None), {"n": None, "t": x.neg()}


def python_scalars(x):
    return 3, 2.5, -0.0, math.nan, -math.inf, True, "s'q\"", 1 + 2j, complex(-0.0, -1.0), x + 1


def sym_values(x):
    n = x.shape[0]
    return n * 2, n > 1, n / 2.0, torch.sym_max(n, x.shape[1]), n


def other_constants(x):
    return slice(1, None, 2), range(3), Ellipsis, Color.RED, x * 3


def user_object(x):  # torch's make_fx refuses these ("argument of type: object")
    return x + 1, MARKER, b"by"


def dict_with_tuple_keys(x):
    return {(1, 2): x, "s": x.shape[0]}


def single_tensor(x):
    return x.exp()


def single_sym(x):
    return x.shape[0] + x.shape[1]


def single_constant_tensor(x):
    return torch.ones(2)


CASES = {f.__name__: f for f in [
    return_types_with_others, return_types_alone, return_types_nested, size_of_new_tensor,
    sizes_with_tensor, torch_enums, nested_containers, namedtuples_and_ordered, nones,
    python_scalars, sym_values, other_constants, dict_with_tuple_keys, single_tensor,
    single_sym, single_constant_tensor, user_object,
]}
TORCH_REFUSES = {"user_object"}


def assert_same_tree(got, expected, path="out"):
    """Same types all the way down, equal values (floats compared by repr: -0.0 and nan too),
    constant objects by identity."""
    assert type(got) is type(expected), f"{path}: {type(got).__name__} != {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert got.shape == expected.shape and got.dtype == expected.dtype, path
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    elif isinstance(expected, dict):
        assert list(got) == list(expected), path
        if isinstance(expected, collections.defaultdict):
            assert got.default_factory is expected.default_factory, path
        for k in expected:
            assert_same_tree(got[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same_tree(a, b, f"{path}[{i}]")
    elif isinstance(expected, (float, complex)):
        assert repr(got) == repr(expected), path
    elif expected is MARKER:
        assert got is MARKER, path
    else:
        assert got == expected, path


def ops(gm):
    """The graph's operations; calls of container types (torch's tracer builds namedtuples with
    a node, ferrodyn builds torch.Size with one) are left out."""
    return [n.target for n in gm.graph.nodes if n.op == "call_function" and not isinstance(n.target, type)]


def _equal_loose(a, b):
    """torch's make_fx rebuilds torch.Size and torch.return_types as plain tuples: compare it
    with eager by value."""
    fa, _ = torch.utils._pytree.tree_flatten(a)
    fb, _ = torch.utils._pytree.tree_flatten(b)
    assert len(fa) == len(fb)
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y)
        elif isinstance(x, float) and math.isnan(x):
            assert math.isnan(y)
        else:
            assert x == y or x is y


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_output_kind_matches_eager_and_torch(name, mode):
    fn = CASES[name]
    x = torch.randn(4, 5)
    gm = make_fx(fn, tracing_mode=mode)(x)
    assert_same_tree(gm(x), fn(x))
    if name not in TORCH_REFUSES:
        ref = torch_make_fx(fn, tracing_mode=mode)(x)
        assert ops(gm) == ops(ref)
        _equal_loose(ref(x), fn(x))
    if mode == "symbolic":
        other = torch.randn(7, 3)
        assert_same_tree(gm(other), fn(other))


def test_size_with_symints_is_built_by_the_graph():
    gm = make_fx(size_of_new_tensor, tracing_mode="symbolic")(torch.randn(4, 5))
    assert torch.ops.aten.sym_size.int in ops(gm)
    assert gm(torch.randn(9, 2)) == torch.Size([9, 3])
    assert type(gm(torch.randn(9, 2))) is torch.Size


def test_object_leaf_is_returned_as_is_every_call():
    gm = make_fx(user_object, tracing_mode="fake")(torch.randn(2))
    first, second = gm(torch.randn(2)), gm(torch.randn(2))
    assert first[1] is MARKER and second[1] is MARKER
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"]


@pytest.mark.parametrize("mode", MODES)
def test_nested_inputs_with_structured_outputs(mode):
    def f(xs, d):
        return torch.max(xs[0] + d["w"], 0), Pair(xs[1].shape, d["w"].dtype)

    args = ([torch.randn(3, 2), torch.randn(3, 2)], {"w": torch.randn(3, 2)})
    gm = make_fx(f, tracing_mode=mode)(*args)
    assert_same_tree(gm(*args), f(*args))
    assert ops(gm) == ops(torch_make_fx(f, tracing_mode=mode)(*args))


@pytest.mark.parametrize("mode", MODES)
def test_outputs_survive_recompile(mode):
    gm = make_fx(return_types_nested, tracing_mode=mode)(torch.randn(4, 5))
    gm.recompile()
    x = torch.randn(4, 5)
    assert_same_tree(gm(x), return_types_nested(x))

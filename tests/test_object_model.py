"""The Python object model that library code (transformers, timm) uses, each construct compiled
with ferrodyn and compared with eager, in one graph, with as many graphs as torch.compile makes
in the same test: function attributes, `__getattribute__`/`__getattr__` overrides, slot wrappers
and descriptors called through their type, classmethods/staticmethods/properties/super,
ABC-metaclass classes (contextlib.nullcontext), functools and itertools, typing isinstance, and
`warnings.warn` replayed after the graph."""

import collections
import collections.abc
import contextlib
import functools
import inspect
import itertools
import logging
import operator
import typing
import warnings

import pytest
import torch

import ferrodyn
from compiled_vs_eager import check_one_graph_like_torch, run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def deco(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapper.marker = 3
    return wrapper


@deco
def scaled(x, k=2, *, bias=1):
    """doc"""
    return x * k + bias


class PretrainedConfigLike:
    """transformers' PretrainedConfig maps attribute names in __getattribute__."""
    attribute_map = {"hidden_size": "d_model"}

    def __init__(self):
        self.d_model = 4

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


CONFIG = PretrainedConfigLike()


class WithGetattr:
    def __init__(self):
        self.real = 2

    def __getattr__(self, name):
        return len(name)


class Base:
    scale = 2

    @classmethod
    def make(cls):
        return cls.scale

    @staticmethod
    def plus(x):
        return x + 1

    @property
    def p(self):
        return 3


class Derived(Base):
    scale = 5

    @classmethod
    def make(cls):
        return super().make() + 1

    @property
    def p(self):
        return super().p + 1


FUNCTION_ATTRS = {
    "code": lambda x: x * scaled.__code__.co_argcount,
    "wrapped_code": lambda x: x * scaled.__wrapped__.__code__.co_argcount,
    "name": lambda x: x + 1 if scaled.__name__ == "scaled" else x - 1,
    "qualname": lambda x: x + len(scaled.__qualname__),
    "module": lambda x: x + 1 if scaled.__module__ == __name__ else x - 1,
    "doc": lambda x: x + 1 if scaled.__doc__ == "doc" else x - 1,
    "defaults": lambda x: x * scaled.__wrapped__.__defaults__[0],
    "kwdefaults": lambda x: x * scaled.__wrapped__.__kwdefaults__["bias"],
    "wrapped_call": lambda x: scaled.__wrapped__(x, 3),
    "dict_attr": lambda x: x * scaled.marker,
    "hasattr_wrapped": lambda x: x + 1 if hasattr(scaled, "__wrapped__") else x - 1,
    "hasattr_missing": lambda x: x + 1 if hasattr(scaled, "nope") else x - 1,
    "getattr_default": lambda x: x * getattr(scaled, "nope", 4),
    "lambda_name": lambda x: x + len((lambda y: y).__name__),
    "nested_defaults": lambda x: x * (lambda y, k=5: y).__defaults__[0],
    "nested_code": lambda x: x * (lambda a, b: a).__code__.co_argcount,
}


@pytest.mark.parametrize("name", list(FUNCTION_ATTRS))
def test_function_attributes(name):
    check_one_graph_like_torch(FUNCTION_ATTRS[name], torch.ones(3))


DESCRIPTORS = {
    "getattribute_override": lambda x: x * CONFIG.hidden_size + CONFIG.d_model,
    "object_getattribute": lambda x: x * object.__getattribute__(CONFIG, "d_model"),
    "getattr_hook": lambda x: x * WithGetattr().abc + WithGetattr().real,
    "dict_get": lambda x: x * dict.get({"a": 2}, "a"),
    "dict_get_default": lambda x: x * dict.get({"a": 2}, "b", 7),
    "str_join": lambda x: x + len(str.join(",", ["a", "b"])),
    "list_len": lambda x: x * list.__len__([1, 2]),
    "dict_getitem": lambda x: dict.__getitem__({"a": x}, "a") * 2,
    "type_call": lambda x: type.__call__(Base).p * x,
    "classmethod_super": lambda x: x * Derived.make(),
    "classmethod_instance": lambda x: x * Derived().make(),
    "property_super": lambda x: x * Derived().p,
    "staticmethod": lambda x: Base.plus(x) + Derived().plus(x),
    "super_two_arg": lambda x: x * super(Derived, Derived()).p,
}


@pytest.mark.parametrize("name", list(DESCRIPTORS))
def test_descriptors_and_slot_wrappers(name):
    check_one_graph_like_torch(DESCRIPTORS[name], torch.ones(3))


def test_getattribute_override_is_never_bypassed():
    class Renames:
        def __init__(self):
            self.a = 1
            self.b = 10

        def __getattribute__(self, key):
            if key == "a":
                key = "b"
            return object.__getattribute__(self, key)

    obj = Renames()

    def fn(x):
        return x * obj.a

    run_all(fn, torch.ones(2))


Pair = collections.namedtuple("Pair", "a b")

FUNCTOOLS_ITERTOOLS = {
    "partial": lambda x: functools.partial(operator.mul, 3)(x),
    "partial_kw": lambda x: functools.partial(scaled, k=4)(x),
    "reduce": lambda x: functools.reduce(operator.add, [x, x, x]),
    "reduce_initial": lambda x: functools.reduce(lambda a, b: a * b, [x, x], x + 1),
    "chain": lambda x: sum(itertools.chain([x], (x,))),
    "chain_from_iterable": lambda x: sum(itertools.chain.from_iterable([[x], [x * 2]])),
    "accumulate": lambda x: list(itertools.accumulate([x, x, x]))[-1],
    "accumulate_fn": lambda x: list(itertools.accumulate([x, x + 1], torch.mul))[-1],
    "pairwise": lambda x: [a + b for a, b in itertools.pairwise([x, x * 2, x * 3])][1],
    "zip_longest": lambda x: [b for a, b in itertools.zip_longest([1, 2], [x], fillvalue=x)][1] * 2,
    "product": lambda x: sum(a * b for a, b in itertools.product([1, 2], [x])),
    "islice": lambda x: sum(itertools.islice([x, x, x], 2)),
    "operator_fns": lambda x: operator.mul(operator.add(x, 1), operator.neg(x)),
    "operator_getitem": lambda x: operator.getitem([x, x * 2], 1),
    "isinstance_mapping": lambda x: x + 1 if isinstance({}, collections.abc.Mapping) else x - 1,
    "isinstance_typing": lambda x: x + 1 if isinstance([], typing.List) else x - 1,
    "isinstance_typing_tuple": lambda x: x + 1 if isinstance(
        (), (typing.Dict, typing.Tuple)) else x - 1,
    "namedtuple": lambda x: Pair(x, 2).a * Pair(x, 2)[1],
    "dict_items_comprehension": lambda x: sum(v * x for k, v in {"a": 1, "b": 2}.items()),
    "dict_keys_iterator": lambda x: x * len([k for k in iter({"a": 1, "b": 2}.keys())]),
    "fstring_tuple": lambda x: x + len(f"{(1, 2)}"),
    "percent_tuple": lambda x: x + len("%s-%s" % (1, 2)),
    "format": lambda x: x + len(format(3, "03d")),
    "nullcontext": lambda x: _with_nullcontext(x),
}


def _with_nullcontext(x):
    with contextlib.nullcontext(x * 2) as y:
        return y + 1


@pytest.mark.parametrize("name", list(FUNCTOOLS_ITERTOOLS))
def test_functools_itertools_and_friends(name):
    check_one_graph_like_torch(FUNCTOOLS_ITERTOOLS[name], torch.ones(3))


def test_warnings_warn_is_replayed_after_the_graph_on_every_call():
    def fn(x):
        warnings.warn("careful", UserWarning)
        return x + 1

    check_one_graph_like_torch(fn, torch.ones(2))
    c = ferrodyn.compile(fn, backend="eager")
    for _ in range(2):  # the first call captures, the second hits the cache
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = c(torch.ones(2))
        assert torch.equal(out, torch.full((2,), 2.0))
        assert [str(w.message) for w in caught] == ["careful"]
        assert caught[0].category is UserWarning


class MappedConfig:
    """PretrainedConfig's pattern: names mapped in __getattribute__, hasattr/getattr(default)
    asked of present and absent names."""
    attribute_map = {"hidden_size": "d_model"}

    def __init__(self):
        self.d_model = 4
        self.use_cache = True

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


MAPPED = MappedConfig()


@pytest.mark.parametrize("name", ["hidden_size", "d_model", "use_cache", "absent", "attribute_map"])
def test_hasattr_and_getattr_default_through_a_getattribute_override(name):
    def fn(x):
        found = hasattr(MAPPED, name)
        v = getattr(MAPPED, name, None)
        return (x + 1 if found else x - 1), v is None

    check_one_graph_like_torch(fn, torch.ones(2))


def test_absent_attribute_seen_by_a_probe_is_guarded():
    cfg = MappedConfig()

    def fn(x, c):
        return x * 2 if hasattr(c, "extra") else x * 3

    c = ferrodyn.compile(fn, backend="eager")
    x = torch.ones(2)
    assert torch.equal(c(x, cfg), fn(x, cfg))
    cfg.extra = 1
    assert torch.equal(c(x, cfg), fn(x, cfg))


def test_eager_frames_reading_an_overriding_object_do_not_recurse_through_guards():
    cfg = MappedConfig()

    def fn(x):
        print("eager")  # the frame runs eagerly; the override's frames run as they are
        return x * cfg.hidden_size + cfg.d_model

    c = ferrodyn.compile(fn, backend="eager")
    for _ in range(3):
        assert torch.equal(c(torch.ones(2)), fn(torch.ones(2)))


def test_id_of_objects_from_the_frame_is_guarded_by_identity():
    a, b = Base(), Base()

    def fn(x, o):
        return x + (1 if id(o) == id(a) else 2)

    c = ferrodyn.compile(fn, backend="eager")
    x = torch.ones(2)
    for o in (a, b, a):
        assert torch.equal(c(x, o), fn(x, o))


def test_id_of_a_new_object_is_refused_not_guessed():
    def fn(x):
        return x + (1 if id(Base()) > 0 else 2)

    run_all(fn, torch.ones(2))


GET_SECOND = operator.itemgetter(1)
GET_SCALE = operator.attrgetter("scale")


class Node:
    def __init__(self):
        self.child = Base()


GETTERS = {
    "itemgetter_global": lambda x: GET_SECOND([x, x * 2]),
    "itemgetter_made": lambda x: sum(operator.itemgetter(0, 2)([x, x * 2, x * 3])),
    "attrgetter_global": lambda x: x * GET_SCALE(Derived()),
    "attrgetter_dotted": lambda x: x * operator.attrgetter("child.scale")(Node()),
    "methodcaller": lambda x: operator.methodcaller("index", 3)([1, 3]) * x,
    "sorted_by_itemgetter": lambda x: sorted([(2, x), (1, x * 3)], key=operator.itemgetter(0))[0][1],
    "class_dict_membership": lambda x: x + 1 if "plus" in Base.__dict__ else x - 1,
    "class_dict_keys": lambda x: x * len([k for k in Derived.__dict__ if not k.startswith("_")]),
}


@pytest.mark.parametrize("name", list(GETTERS))
def test_operator_getters_and_class_dicts(name):
    check_one_graph_like_torch(GETTERS[name], torch.ones(3))


def test_class_dict_read_in_the_frame_is_guarded():
    class Late:
        pass

    def fn(x):
        return x + 1 if "extra" in Late.__dict__ else x - 1

    c = ferrodyn.compile(fn, backend="eager")
    assert torch.equal(c(torch.ones(2)), fn(torch.ones(2)))
    Late.extra = 1
    assert torch.equal(c(torch.ones(2)), fn(torch.ones(2)))


def chunk_fn(hidden, extra=None):
    return hidden * 2


class Chunker:
    def ff(self, hidden):
        return hidden + 1


SIGNATURES = {
    "function": lambda x: x * len(inspect.signature(chunk_fn).parameters),
    "bound_method": lambda x: x * len(inspect.signature(Chunker().ff).parameters),
    "parameter_names": lambda x: x + 1 if "extra" in inspect.signature(chunk_fn).parameters
    else x - 1,
    "parameter_default": lambda x: x + 1 if inspect.signature(
        chunk_fn).parameters["extra"].default is None else x - 1,
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_inspect_signature_of_known_functions(name):
    check_one_graph_like_torch(SIGNATURES[name], torch.ones(3))


class Registry(dict):
    """transformers' _CanRecordRegistry: a dict subclass read through super().get."""

    def get(self, key):
        return super().get(key) or {}


REGISTRY = Registry(a={"k": 2})


def test_builtin_dict_methods_of_a_dict_subclass_from_the_frame():
    def fn(x):
        return x * REGISTRY.get("a")["k"] + len(REGISTRY.get("b"))

    check_one_graph_like_torch(fn, torch.ones(3))
    c = ferrodyn.compile(fn, backend="eager")
    assert torch.equal(c(torch.ones(3)), fn(torch.ones(3)))
    REGISTRY["b"] = {"z": 1}  # the keys read are guarded
    try:
        assert torch.equal(c(torch.ones(3)), fn(torch.ones(3)))
    finally:
        del REGISTRY["b"]


class LayeredConfig(MappedConfig):
    """Two __getattribute__ overrides chained through super() (transformers' heterogeneity
    mixin under PretrainedConfig)."""

    def __getattribute__(self, key):
        spec = super().__getattribute__("__dict__").get("_spec")
        if spec is not None and key in spec:
            return spec[key]
        return super().__getattribute__(key)


LAYERED = LayeredConfig()


@pytest.mark.parametrize("name", ["hidden_size", "use_cache", "absent"])
def test_hasattr_through_chained_getattribute_overrides(name):
    def fn(x):
        return x * 2 if hasattr(LAYERED, name) else x * 3

    check_one_graph_like_torch(fn, torch.ones(2))


LOGGER = logging.getLogger("ferrodyn.tests.objmodel")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_logging_calls_are_replayed_after_the_graph_in_order():
    def fn(x):
        LOGGER.info("first %d", 1)
        y = x * 2
        LOGGER.warning(f"second {y.shape[0]}")
        return y + 1

    records = _Records()
    LOGGER.addHandler(records)
    LOGGER.setLevel(logging.INFO)
    try:
        _, _, fd, tc = run_all(fn, torch.ones(2))  # (the handler's own frame is not fn's)
        assert fd == 1 and tc >= fd  # torch.compile breaks the graph at the logging calls
        records.messages.clear()
        c = ferrodyn.compile(fn, backend="eager")
        for _ in range(2):  # capture, then a cache hit
            assert torch.equal(c(torch.ones(2)), torch.full((2,), 3.0))
        assert records.messages == ["first 1", "second 2"] * 2
    finally:
        LOGGER.removeHandler(records)

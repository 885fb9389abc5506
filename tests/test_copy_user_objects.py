"""`copy.copy` of an instance of a plain Python class inside the traced code (transformers'
`_get_layer_config` does `copy.copy(config)` then sets attributes on the copy): CPython's path
`object.__reduce_ex__(x, 4)` -> `copy._reconstruct` (`copyreg.__newobj__(cls)`, then
`y.__dict__.update(state)`), through a class's own `__getattribute__` too. Compiled vs eager:
the copy's attributes (its values the original's objects: a shallow copy), the original left
unchanged, graph counts against torch.compile's; classes outside the model are refused."""

import copy

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Config:
    def __init__(self):
        self.scale = 2.0
        self.shared = [1, 2]


class MappedConfig(Config):
    attribute_map = {"factor": "scale"}

    def __getattribute__(self, key):  # PreTrainedConfig's alias lookup
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


class WithReduce(Config):
    def __reduce__(self):
        return (WithReduce, ())


class Slotted:
    __slots__ = ("scale",)

    def __init__(self):
        self.scale = 2.0


def _prime(*classes):
    for cls in classes:  # eager's first copy stores the class's __slotnames__ cache
        copy.copy(cls())


def copies(cfg):
    def fn(x):
        y = x.sin()  # a graph op before the copy: a break at it makes two graphs
        c = copy.copy(cfg)
        c.scale = 3.0
        return y * c.scale + cfg.scale, c
    return fn


def _run(cfg):
    counts, got = {}, {}
    for name in ("eager", "ferrodyn", "torch"):
        torch._dynamo.reset()
        ferrodyn.reset()
        backend = CountingBackend()
        fn = copies(cfg)
        f = {"eager": fn, "ferrodyn": ferrodyn.compile(fn, backend=backend),
             "torch": torch.compile(fn, backend=backend)}[name]
        x = torch.arange(3.0)
        outs = [f(x) for _ in range(2)]
        got[name] = outs
        counts[name] = backend.count
    for (y, c), (y0, c0) in zip(got["ferrodyn"], got["eager"]):
        torch.testing.assert_close(y, y0)
        assert type(c) is type(c0) and c is not cfg
        assert vars(c) == vars(c0) and c.shared is cfg.shared  # shallow: the same list
    assert cfg.scale == 2.0  # the original is unchanged
    return counts["ferrodyn"], counts["torch"]


@pytest.mark.parametrize("cls", [Config, MappedConfig])
def test_copy_of_a_plain_object_is_one_graph(cls):
    _prime(cls)
    ours, theirs = _run(cls())
    assert ours == theirs == 1


def test_copy_of_a_mapped_config_reads_through_its_alias():
    _prime(MappedConfig)
    cfg = MappedConfig()

    def fn(x):
        y = x.sin()
        c = copy.copy(cfg)
        c.scale = 5.0
        return y * c.factor + cfg.factor

    backend = CountingBackend()
    f = ferrodyn.compile(fn, backend=backend)
    torch.testing.assert_close(f(torch.ones(2)), fn(torch.ones(2)))
    assert backend.count == 1


@pytest.mark.parametrize("cls", [WithReduce, Slotted])
def test_copy_outside_the_model_is_refused_and_still_exact(cls):
    assert _run_refused(cls) == 2  # a graph break at the copy


def _run_refused(cls):
    cfg = cls()
    backend = CountingBackend()

    def fn(x):
        y = x.sin()  # a graph op before the copy: a break at it makes two graphs
        c = copy.copy(cfg)
        c.scale = 3.0
        return y * c.scale + cfg.scale, c

    y, c = ferrodyn.compile(fn, backend=backend)(torch.arange(3.0))
    y0, c0 = fn(torch.arange(3.0))
    torch.testing.assert_close(y, y0)
    assert type(c) is type(c0) and c.scale == 3.0 and cfg.scale == 2.0
    return backend.count

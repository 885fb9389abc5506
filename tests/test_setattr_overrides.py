"""Attribute stores on objects from outside the frame whose class overrides `__setattr__` (the
override runs, inlined, as in CPython: transformers' config classes remap names) and explicit
`object.__setattr__(obj, ...)` (past the override; replayed exactly); a data descriptor for the
name is refused, never bypassed. Compiled == eager, state included, graph counts against
torch.compile's."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Config:
    def __init__(self):
        object.__setattr__(self, "num_heads", 2)
        object.__setattr__(self, "log", [])

    def __setattr__(self, key, value):
        key = "num_heads" if key == "heads" else key
        self.log.append(key)
        super().__setattr__(key, value)


class WithProperty:
    def __init__(self):
        self._scale = 1.0

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, v):
        self._scale = v * 2


def remapped_store(x, cfg):
    cfg.heads = cfg.num_heads + 1
    return x * cfg.num_heads


def explicit_object_setattr(x, cfg):
    object.__setattr__(cfg, "num_heads", 7)  # past Config.__setattr__: nothing is logged
    return x + cfg.num_heads


def through_property(x, obj):
    object.__setattr__(obj, "scale", 3.0)  # object.__setattr__ runs the property's setter
    return x * obj.scale


def _state(o):
    return dict(vars(o))


@pytest.mark.parametrize("fn, make", [(remapped_store, Config), (explicit_object_setattr, Config),
                                      (through_property, WithProperty)],
                         ids=["remapped_store", "explicit_object_setattr", "through_property"])
def test_setattr_on_existing_objects(fn, make):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    compiled = ferrodyn.compile(fn, backend=ours)
    by_torch = torch.compile(fn, backend=theirs)
    x = torch.arange(3.0)
    for _ in range(3):
        mine, eager_obj, torch_obj = make(), make(), make()
        want = fn(x, eager_obj)
        torch.testing.assert_close(compiled(x, mine), want)
        by_torch(x, torch_obj)
        assert _state(mine) == _state(eager_obj)
    if fn is not through_property:
        assert ours.count == 1 and ours.count <= theirs.count

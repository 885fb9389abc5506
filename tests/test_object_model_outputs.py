"""Dict-subclass objects made in the frame: the pattern of transformers' ModelOutput (a dataclass
subclassing OrderedDict with `__post_init__`, `__setattr__`/`__setitem__` overrides,
`__getitem__` by str and int, `to_tuple`) written here; dataclass `fields`. The real ModelOutput
classes are in test_object_model_transformers.py. Compiled vs eager (items,
attributes and type of returned objects included), one graph, torch.compile's count beside."""

import collections
import dataclasses
from typing import Optional

import pytest
import torch
from compiled_vs_eager import check_one_graph_like_torch

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class LocalOutput(collections.OrderedDict):
    """The ModelOutput pattern without transformers."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = self.__dict__.get(f.name)
            if v is not None:
                self[f.name] = v

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class Local(LocalOutput):
    first: torch.Tensor = None
    second: Optional[torch.Tensor] = None
    third: Optional[torch.Tensor] = None


OUTPUT_CLASSES = [Local]


def _fields(cls):
    return [f.name for f in dataclasses.fields(cls)][:2]


def _uses(cls):
    a, b = _fields(cls)

    def by_name(x):
        o = cls(**{a: x + 1, b: x * 2})
        return o[b] + o[a] + getattr(o, a)

    def by_index(x):
        o = cls(**{a: x + 1, b: x * 2})
        return o[0] * o[1] + o.to_tuple()[1]

    def dict_protocol(x):
        o = cls(**{a: x + 1})
        return x * len(o) + (1 if a in o else 0), list(o.keys()), [k for k in o]

    def none_fields_skipped(x):
        o = cls(**{a: x - 1, b: None})
        return len(o.to_tuple()), o[0] * 3

    def returned(x):
        return cls(**{a: torch.relu(x), b: x + 3})

    def returned_partial(x):
        return cls(**{a: x + 1})

    def fields_of_instance(x):
        o = cls(**{a: x})
        return x * len(dataclasses.fields(o)), dataclasses.is_dataclass(o)

    return [by_name, by_index, dict_protocol, none_fields_skipped, returned, returned_partial,
            fields_of_instance]


CASES = [(cls, fn) for cls in OUTPUT_CLASSES for fn in _uses(cls)]


@pytest.mark.parametrize("cls,fn", CASES, ids=[f"{c.__name__}-{f.__name__}" for c, f in CASES])
def test_model_output_objects(cls, fn):
    check_one_graph_like_torch(fn, torch.randn(3))

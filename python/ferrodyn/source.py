"""Sources: where a value the converter read came from, relative to the frame.

Owns the Source classes and `name()` (the guard/explain expression,
`L['self']._modules['fc'].weight`). Does not own guards (guard_spec.py), how guards compile to
Rust (guards.py) or how generated code loads a source (codegen.SOURCE_LOADERS: bytecode).

A frame's values are reached from four roots: argument slots (`L`), globals (`G`), builtins
(`B`) and closure cells (`C`); everything else chains from a root.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def source_class(cls):
    """Make `cls` a frozen dataclass whose hash is computed once per instance: sources are
    dictionary keys throughout capture, and a chain would otherwise re-hash its whole base path
    on every lookup."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    field_hash = cls.__hash__

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = field_hash(self)
            object.__setattr__(self, "_hash", h)
        return h

    cls.__hash__ = __hash__
    return cls


class Source:
    """Base class. Sources are frozen dataclasses (made with `source_class`): hashable and
    comparable, so one accessor is made per distinct path."""

    def name(self) -> str:
        raise NotImplementedError

    def root(self) -> "Source":
        return self

    def __str__(self) -> str:
        return self.name()


@source_class
class LocalSource(Source):
    """Argument slot `index` of the frame, named `local_name` in co_varnames."""
    index: int
    local_name: str

    def name(self) -> str:
        return f"L[{self.local_name!r}]"


@source_class
class GlobalSource(Source):
    global_name: str

    def name(self) -> str:
        return f"G[{self.global_name!r}]"


@source_class
class BuiltinSource(Source):
    builtin_name: str

    def name(self) -> str:
        return f"B[{self.builtin_name!r}]"


@source_class
class ClosureSource(Source):
    """Contents of closure cell `index` (co_freevars order)."""
    index: int
    cell_name: str

    def name(self) -> str:
        return f"C[{self.cell_name!r}]"


@source_class
class _Chained(Source):
    base: Source

    def root(self) -> Source:
        return self.base.root()


@source_class
class AttrSource(_Chained):
    """`base.attr` through getattr (properties, descriptors, `nn.Module.__getattr__`)."""
    attr: str

    def name(self) -> str:
        return f"{self.base.name()}.{self.attr}"


@source_class
class DictOfSource(_Chained):
    """`base.__dict__`, read directly (how module parameters are reached without
    `nn.Module.__getattr__`: `DictOf(m) -> Item('_parameters') -> Item('weight')`)."""

    def name(self) -> str:
        return f"{self.base.name()}.__dict__"


@source_class
class ItemSource(_Chained):
    """`base[key]` for a constant key (int index, str, or other hashable constant)."""
    key: Any

    def name(self) -> str:
        return f"{self.base.name()}[{self.key!r}]"


@source_class
class DictItemSource(_Chained):
    """`dict.__getitem__(base, key)`: the item in a dict instance's storage, read past the
    `__getitem__`/`__missing__` overrides of its class (how the items of a dict subclass
    instance that overrides `__getitem__` are reached and guarded)."""
    key: Any

    def name(self) -> str:
        return f"dict.__getitem__({self.base.name()}, {self.key!r})"


@source_class
class TypeSource(_Chained):
    """`type(base)`."""

    def name(self) -> str:
        return f"type({self.base.name()})"


@source_class
class LenSource(_Chained):
    """`len(base)`."""

    def name(self) -> str:
        return f"len({self.base.name()})"


@source_class
class SetItemSource(_Chained):
    """The `index`-th element of a set or frozenset in its iteration order (`list(base)[index]`):
    how the elements of a set from the frame are reached and guarded."""
    index: int

    def name(self) -> str:
        return f"list({self.base.name()})[{self.index}]"


@source_class
class DictValueSource(_Chained):
    """The `index`-th value of a dict in insertion order (`list(base.values())[index]`): how the
    value of a key reached by position (a tensor key) is read."""
    index: int

    def name(self) -> str:
        return f"list({self.base.name()}.values())[{self.index}]"

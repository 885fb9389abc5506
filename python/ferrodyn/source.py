"""Sources: where a value the converter read came from, relative to the frame.

Owns the Source classes and their two renderings: `name()` (the guard/explain expression,
`L['self']._modules['fc'].weight`) and `to_python(env)` (a Python expression for generated
code). Does not own guards (guard_spec.py) or how guards compile to Rust (guards.py).

A frame's values are reached from four roots: argument slots (`L`), globals (`G`), builtins
(`B`) and closure cells (`C`); everything else chains from a root.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


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

    def to_python(self, env: "CodegenEnv") -> str:
        """A Python expression that evaluates to this value inside a generated entry function."""
        raise NotImplementedError

    def root(self) -> "Source":
        return self

    def __str__(self) -> str:
        return self.name()


class CodegenEnv:
    """What `to_python` needs: parameter names of the generated function for argument slots and
    closure cells, and the name under which the user's globals / builtins dicts are reachable."""

    def __init__(self, local_names: Mapping[int, str], cell_names: Mapping[int, str],
                 globals_name: str = "__ferrodyn_G", builtins_name: str = "__ferrodyn_B"):
        self.local_names = dict(local_names)
        self.cell_names = dict(cell_names)
        self.globals_name = globals_name
        self.builtins_name = builtins_name
        # values that are not literals (enum members, dtypes, floats such as nan, tuples of
        # those): bound as globals of the generated function, never rendered with `repr`
        self.bindings: dict[str, Any] = {}

    def literal(self, value: Any) -> str:
        """A Python expression for the constant `value` (a dict key, an index)."""
        if value is None or value is True or value is False or type(value) in (int, str, bytes):
            return repr(value)
        for name, bound in self.bindings.items():
            if bound is value:
                return name
        name = f"__ferrodyn_key{len(self.bindings)}"
        self.bindings[name] = value
        return name


@source_class
class LocalSource(Source):
    """Argument slot `index` of the frame, named `local_name` in co_varnames."""
    index: int
    local_name: str

    def name(self) -> str:
        return f"L[{self.local_name!r}]"

    def to_python(self, env: CodegenEnv) -> str:
        return env.local_names[self.index]


@source_class
class GlobalSource(Source):
    global_name: str

    def name(self) -> str:
        return f"G[{self.global_name!r}]"

    def to_python(self, env: CodegenEnv) -> str:
        return f"{env.globals_name}[{self.global_name!r}]"


@source_class
class BuiltinSource(Source):
    builtin_name: str

    def name(self) -> str:
        return f"B[{self.builtin_name!r}]"

    def to_python(self, env: CodegenEnv) -> str:
        return f"{env.builtins_name}[{self.builtin_name!r}]"


@source_class
class ClosureSource(Source):
    """Contents of closure cell `index` (co_freevars order)."""
    index: int
    cell_name: str

    def name(self) -> str:
        return f"C[{self.cell_name!r}]"

    def to_python(self, env: CodegenEnv) -> str:
        return f"{env.cell_names[self.index]}.cell_contents"


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

    def to_python(self, env: CodegenEnv) -> str:
        return f"{self.base.to_python(env)}.{self.attr}"


@source_class
class DictOfSource(_Chained):
    """`base.__dict__`, read directly (how module parameters are reached without
    `nn.Module.__getattr__`: `DictOf(m) -> Item('_parameters') -> Item('weight')`)."""

    def name(self) -> str:
        return f"{self.base.name()}.__dict__"

    def to_python(self, env: CodegenEnv) -> str:
        return f"{self.base.to_python(env)}.__dict__"


@source_class
class ItemSource(_Chained):
    """`base[key]` for a constant key (int index, str, or other hashable constant)."""
    key: Any

    def name(self) -> str:
        return f"{self.base.name()}[{self.key!r}]"

    def to_python(self, env: CodegenEnv) -> str:
        return f"{self.base.to_python(env)}[{env.literal(self.key)}]"


@source_class
class TypeSource(_Chained):
    """`type(base)`."""

    def name(self) -> str:
        return f"type({self.base.name()})"

    def to_python(self, env: CodegenEnv) -> str:
        return f"type({self.base.to_python(env)})"


@source_class
class LenSource(_Chained):
    """`len(base)`."""

    def name(self) -> str:
        return f"len({self.base.name()})"

    def to_python(self, env: CodegenEnv) -> str:
        return f"len({self.base.to_python(env)})"

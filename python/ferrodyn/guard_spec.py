"""Guard specifications: what a trace depended on, as (source, kind, payload) records.

Owns the closed set of guard kinds and the `GuardSpec` record. The converter installs specs on
the output graph when it uses a value; `guards.py` compiles a list of specs into a Rust
`GuardTree` through `ferrodyn._C.GuardBuilder`. Nothing here evaluates a guard.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ferrodyn.source import Source


class GuardKind(enum.Enum):
    """Each kind maps to one GuardBuilder leaf (see _C.pyi)."""

    TYPE_MATCH = "type_is"        # payload: the type
    ID_MATCH = "is_"              # payload: the object
    NONE = "is_none"              # payload: None
    NOT_NONE = "is_not_none"      # payload: None
    EQUALS = "equals"             # payload: constant (None/bool/int/float/str/bytes/tuples)
    LENGTH = "length_is"          # payload: int
    DICT_KEYS = "dict_keys"       # payload: tuple of keys, in order
    DICT_LACKS = "dict_lacks"     # payload: a key the dict must not hold (an attribute name)
    DICTS_EMPTY = "dicts_empty"   # payload: tuple of str keys whose values must be empty
    TENSOR_MATCH = "tensor_match" # payload: the example tensor; options: dynamic_dims
    GLOBAL_STATE = "global_state" # source: None, payload: None
    NO_HANDLED_EXCEPTION = "no_handled_exception"  # source: None: sys.exception() is None
    ALIASING = "aliasing"         # source: None, payload: (sources, identity groups,
                                  #   storage groups: (group, offset) per tensor, None otherwise)
    SHAPE = "shape_guard"         # source: None, payload: (prefix tokens, ((Source, kind, dim), ...))


@dataclass(frozen=True)
class GuardSpec:
    source: Source | None
    kind: GuardKind
    payload: Any = field(default=None, compare=False, hash=False)
    # Identity of the payload for deduplication (types/objects compare by id).
    key: Any = None
    dynamic_dims: tuple[int, ...] = ()

    @staticmethod
    def make(source: Source | None, kind: GuardKind, payload: Any = None,
             dynamic_dims: tuple[int, ...] = ()) -> "GuardSpec":
        if kind in (GuardKind.TYPE_MATCH, GuardKind.ID_MATCH, GuardKind.TENSOR_MATCH):
            key = id(payload)
        elif kind in (GuardKind.EQUALS, GuardKind.LENGTH, GuardKind.DICT_KEYS, GuardKind.DICT_LACKS,
                      GuardKind.DICTS_EMPTY, GuardKind.ALIASING,
                      GuardKind.SHAPE):
            key = (type(payload), payload)
        else:
            key = None
        return GuardSpec(source, kind, payload, key, tuple(dynamic_dims))

    def describe(self) -> str:
        if self.kind is GuardKind.SHAPE:
            return f"SHAPE({self.payload[0]} over {', '.join(s.name() for s, _, _ in self.payload[1])})"
        src = self.source.name() if self.source is not None else "<global state>"
        return f"{self.kind.name}({src})"

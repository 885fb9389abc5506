"""The translator's product for one frame, handed to the frontend (convert_frame.py).

Owns the `TraceResult` record and the output-rebuild spec: how the frame's return value is
rebuilt from graph outputs, constants and frame values. The translator (symbolic/) fills it in;
the frontend compiles `graph` with the backend, compiles `guards` into a Rust tree and
generates the entry function from `graph_inputs` and `output`. Nothing here traces or compiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.fx

from ferrodyn.guard_spec import GuardSpec
from ferrodyn.source import Source


class Out:
    """A node of the return-value rebuild spec."""


@dataclass(frozen=True)
class OutGraph(Out):
    """Output `index` of the compiled graph (the graph returns a flat tuple)."""
    index: int


@dataclass(frozen=True)
class OutConst(Out):
    """A constant; must be reproducible by reference (held by the entry)."""
    value: Any


@dataclass(frozen=True)
class OutSource(Out):
    """A value read from the frame (returned unchanged, e.g. `return x` of a non-tensor)."""
    source: Source


@dataclass(frozen=True)
class OutTuple(Out):
    items: tuple[Out, ...]


@dataclass(frozen=True)
class OutList(Out):
    items: tuple[Out, ...]


@dataclass(frozen=True)
class OutDict(Out):
    """A dict (or an OrderedDict etc. when `cls` is given) of constant keys."""
    keys: tuple[Any, ...]
    values: tuple[Out, ...]
    cls: type = dict


@dataclass(frozen=True)
class OutCall(Out):
    """`cls(*args)` with positional items: namedtuples (`cls._make`-compatible) and other
    reconstructible classes; for dataclasses, `kwnames` names the fields."""
    cls: Any
    args: tuple[Out, ...]
    kwnames: tuple[str, ...] = ()


@dataclass(frozen=True)
class OutShared(Out):
    """`value`, evaluated once per entry call: every later occurrence of the same `key` is the
    same object (new mutable objects reached twice; values read before side effects run)."""
    key: int
    value: Out


@dataclass(frozen=True)
class OutCell(Out):
    """The closure cell `index` (co_freevars order) of the frame itself (not its contents)."""
    index: int


@dataclass
class TraceResult:
    """One whole-frame capture.

    graph: placeholders in `graph_inputs` order; returns a flat tuple of outputs.
    graph_inputs: for each placeholder, where the entry function loads it from.
    example_inputs: the real values of the graph inputs on this call (for the backend).
    output: how to rebuild the frame's return value.
    graph_break: where and how the frame continues after a graph break (resume.py).
    guards: everything the trace depended on.
    side_effects: Out nodes the entry evaluates in order, for their effect only, after the
        graph call and before building `output` (side_effects.SideEffects.replay).
    """

    graph: torch.fx.GraphModule
    graph_inputs: list[Source]
    example_inputs: list[Any]
    output: Out
    guards: list[GuardSpec] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for explain(): ops, decisions
    side_effects: tuple[Out, ...] = ()
    graph_has_effects: bool = False  # the graph mutates an input in place: always call it
    # the trace folded `torch.compiler.is_compiling()` (and its aliases) to True
    read_is_compiling: bool = False
    # set when the frame continues after a graph break (a resume.GraphBreak): the entry then
    # rebuilds the live stack and locals instead of returning `output`.
    graph_break: Any = None

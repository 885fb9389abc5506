"""The rest of a `for` loop's iterator across a graph break.

Owns `LoopRest` (what the entry hands a resume function for an iterator on the stack: a tuple
to CPython, iterated by the prologue's GET_ITER) and its tracker: an input iterated lazily, so
a resume function of a loop body is not specialised on how many iterations are left (item k
is guarded when the loop reaches it, the length only when the loop ends; its ints are
automatic-dynamic, dynamic.py). The builder's type table builds it (variables/builder.py).
Does not own the resume function (code.py) or when a break happens (capture.py).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import ItemSource
from ferrodyn.trace_result import Out, OutCall, OutConst, OutSource
from ferrodyn.variables.base import LazyVariable, VariableTracker


class LoopRest(tuple):
    """What a `for` loop's iterator still yields, handed to a resume function (its prologue
    iterates it: GET_ITER). A tuple to CPython; to the converter an input iterated lazily
    (`LoopRestVariable`): item k is guarded only when the loop reaches it, and its length only
    when the loop ends, so the resume function of a loop body is not specialised on how many
    iterations are left."""
    __slots__ = ()


class _LoopRestStep:
    """The step of an iterator over a LoopRest input: item `pos` through its Source (a type
    guard on it fails where the input is shorter), or, past the end, a length guard."""

    def __init__(self, source, value: tuple):
        self.source, self.value, self.pos = source, value, 0

    def __call__(self, tx):
        if self.pos >= len(self.value):
            tx.output.install_guard(self.source, GuardKind.LENGTH, self.pos)
            return None
        src = ItemSource(self.source, self.pos)
        v = self.value[self.pos]
        tx.output.install_guard(src, GuardKind.TYPE_MATCH, type(v))
        self.pos += 1
        return tx.realize(LazyVariable(source=src, value=v))

    def rest(self) -> Out:
        return OutCall(LoopRest, (OutCall(operator.getitem, (OutSource(self.source),
                                                             OutConst(slice(self.pos, None)))),))


def build_loop_rest(tx, value: LoopRest, source):
    """The builder's entry for a LoopRest input (variables/builder.py's type table)."""
    from ferrodyn.variables.lists import IterState, IteratorVariable
    tx.output.install_guard(source, GuardKind.TYPE_MATCH, LoopRest)
    return _LoopRestVariable(source=source, value=value,
                             it=IteratorVariable(state=IterState([], step=_LoopRestStep(source, value))))


@dataclass(frozen=True, eq=False)
class _LoopRestVariable(VariableTracker):
    value: Any = None
    it: Any = None

    def python_type(self):
        return LoopRest

    def describe(self):
        return "the rest of a loop's iterator"

    def iterator(self, tx):
        return self.it  # one iterator: the prologue's GET_ITER is its only use

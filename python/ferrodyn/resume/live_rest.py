"""A `for` loop's iterator over a live list (or a zip/enumerate of such), across a graph break.

Owns `LiveRest` (what the entry hands a resume function for a loop iterator that is not pure,
resume/loops.py: it walks a list that is live at the break, e.g. `for a, s in zip(anchors,
image_sizes)` where `image_sizes` is an argument or is also reachable from another live value)
and its tracker. Handing the resume function CPython's real iterator would be exact but makes
it run eagerly (real iterators are not modelled as inputs); a LiveRest is the same iterator in
parts the builder can model: `("list", lst, index)`, `("zip", *parts)`, `("enumerate", part,
start)`, a part being a LoopRest (pure items) or another LiveRest. The resume prologue's
GET_ITER turns it into the real iterator (`__iter__`: CPython's list iterator over `lst` at
`index`, `zip`/`enumerate` of its parts), so an eager run of the resume function iterates
exactly what the traced frame would have. Traced, the list is the live list (its later
mutations, through any alias, show through as in CPython) and the position is guarded
(one entry per position, as torch.compile's iterator-length guard).
Map, filter, reversed and dict iterators are not covered: they stay real iterators.
Does not own which iterators are pure or refused (loops.py), nor the resume function (code.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import AttrSource, ItemSource
from ferrodyn.trace_result import Out, OutCall, OutConst, OutTuple
from ferrodyn.variables.base import LazyVariable, VariableTracker, unsupported


class LiveRest:
    """`kind` and `args` of a loop iterator handed to a resume function (module docstring)."""
    __slots__ = ("kind", "args")

    def __init__(self, kind: str, args: tuple):
        self.kind, self.args = kind, args

    def __iter__(self):
        from ferrodyn.resume.loops import list_iter_at
        if self.kind == "list":
            return list_iter_at(self.args[0], self.args[1])
        if self.kind == "zip":
            return zip(*self.args)
        if self.kind == "enumerate":
            return enumerate(self.args[0], self.args[1])
        raise TypeError(f"LiveRest of unknown kind {self.kind!r}")

    def __repr__(self):
        return f"LiveRest({self.kind!r}, {self.args!r})"


def live_rest(tx, v, lists: set) -> Out | None:
    """Out of a LiveRest (or a LoopRest) standing for live iterator `v` (already checked by
    loops.iterator_refusal), or None where a part is of a kind not covered here."""
    from ferrodyn.resume.loops import LoopRest, _LoopRestStep, _parts
    from ferrodyn.variables.lists import IteratorVariable
    if not isinstance(v, IteratorVariable):
        return None
    st = v.state
    if isinstance(st.step, _LoopRestStep):
        return st.step.rest()
    if st.step is None:
        out, seq, _pure = _parts(tx, v, lists)
        if seq:
            return OutCall(LoopRest, (out,))
        lst, index = out.args  # list_iter_at(lst, index)
        return _make("list", (lst, index))
    if st.rebuild is None:
        return None
    r = st.rebuild()
    if r.refuse or r.kind not in ("zip", "enumerate"):
        return None
    parts = [live_rest(tx, p, lists) for p in r.parts]
    if any(p is None for p in parts):
        return None
    if r.kind == "zip":
        return _make("zip", tuple(parts))
    return _make("enumerate", (parts[0], OutConst(r.consts[0])))


def _make(kind: str, args: tuple) -> Out:
    return OutCall(LiveRest, (OutConst(kind), OutTuple(tuple(args))))


def build_live_rest(tx, value: LiveRest, source):
    """The builder's entry for a LiveRest input (variables/builder.py's type table)."""
    from ferrodyn.variables.lists import (IteratorVariable, IterState, ListVariable,
                                          enumerate_iterator, zip_iterator)
    out = tx.output
    out.install_guard(source, GuardKind.TYPE_MATCH, LiveRest)
    out.install_guard(AttrSource(source, "kind"), GuardKind.EQUALS, value.kind)
    args_src = AttrSource(source, "args")
    out.install_guard(args_src, GuardKind.TYPE_MATCH, tuple)
    out.install_guard(args_src, GuardKind.LENGTH, len(value.args))

    def part(i):
        return tx.realize(LazyVariable(source=ItemSource(args_src, i), value=value.args[i]))

    def const(i):
        out.install_guard(ItemSource(args_src, i), GuardKind.TYPE_MATCH, int)
        out.install_guard(ItemSource(args_src, i), GuardKind.EQUALS, value.args[i])
        return value.args[i]

    if value.kind == "list":
        lst = part(0)
        if not isinstance(lst, ListVariable):
            unsupported(f"a loop over a {lst.describe()} handed to a resume function",
                        BreakReason.UNSUPPORTED_TYPE)
        it = IteratorVariable(state=IterState(lst.state.items, index=const(1), owner=lst.state))
    elif value.kind == "zip":
        it = zip_iterator(tx, [part(i) for i in range(len(value.args))])
    elif value.kind == "enumerate":
        it = enumerate_iterator(tx, part(0), const(1))
    else:
        unsupported(f"LiveRest of kind {value.kind!r}", BreakReason.UNSUPPORTED_TYPE)
    return _LiveRestVariable(source=source, value=value, it=it)


@dataclass(frozen=True, eq=False)
class _LiveRestVariable(VariableTracker):
    value: Any = None
    it: Any = None

    def python_type(self):
        return LiveRest

    def describe(self):
        return "the rest of a loop's iterator over a live list"

    def iterator(self, tx):
        return self.it  # one iterator: the prologue's GET_ITER is its only use

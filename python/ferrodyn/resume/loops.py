"""The rest of a `for` loop's iterator, and every other iterator, across a graph break.

Owns `LoopRest` (what the entry hands a resume function for an iterator on the stack: a tuple
to CPython, iterated by the prologue's GET_ITER) and its tracker: an input iterated lazily, so
a resume function of a loop body is not specialised on how many iterations are left (item k
is guarded when the loop reaches it, the length only when the loop ends; its ints are
automatic-dynamic, dynamic.py). The builder's type table builds it (variables/builder.py).

Owns too how an iterator live at a break is rebuilt (`iterator_refusal`, `rebuild_iterator`):
as a real CPython iterator standing where the traced one stands, made from its parts
(`IterState.rebuild`, variables/lists.py): `enumerate(<rest of inner>, k)`, `zip(...)`,
`map(fn, ...)`/`filter(fn, ...)` (still lazy: their function runs when an item is taken),
a list iterator over a live list as CPython's own at its index (`list_iter_at`; later
mutations show through), a dict iterator as CPython's own advanced to its position
(`dict_iter_at`; a size change still raises). What may be produced at the break without
running user code or reading a live container (snapshots, loop rests, enumerate and zip of
them) is "pure": a `for` loop's pure iterator goes to the resume function as the LoopRest of
its items; an impure one as the real iterator (the resume function then runs eagerly: real
iterators are not modelled as inputs). Refused (the break does not resume): an iterator
whose parts cannot be rebuilt exactly (an EXISTING list or dict mutated in this trace, whose
replay would move the real iterator; a dict whose key set changed since the iterator began:
CPython raises; an exhausted reversed or dict iterator; itertools iterators other than
these).
Does not own the resume function (code.py) or when a break happens (capture.py).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import ItemSource
from ferrodyn.trace_result import Out, OutCall, OutConst, OutList, OutSource, OutTuple
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


# ---------------------------------------------------------------------------------------------
# Iterators live across a break: rebuilt as real CPython iterators from their parts
# ---------------------------------------------------------------------------------------------

def list_iter_at(lst: list, index: int):
    """CPython's list iterator over `lst` standing at `index` (the entry's rebuild)."""
    it = iter(lst)
    it.__setstate__(index)
    return it


def list_reviter_at(lst: list, index: int):
    """CPython's reversed list iterator over `lst` whose next item is `lst[index]`."""
    it = reversed(lst)
    it.__setstate__(index)
    return it


def dict_iter_at(d: dict, kind: str, pos: int, reverse: bool):
    """CPython's iterator over `d`'s keys, values or items advanced past `pos` items (taking
    dict items runs no user code); it checks `d`'s size from now on, as the traced one did."""
    view = getattr(d, kind)()
    it = reversed(view) if reverse else iter(view)
    for _ in range(pos):
        next(it)
    return it


def zip_strict(*iterators):
    return zip(*iterators, strict=True)


class _Refused(Exception):
    pass


def iterator_refusal(v, lists: set) -> str | None:
    """Why live iterator `v` cannot be rebuilt exactly at a break, or None. `lists`: the ids
    of the items of the lists live at the break (an iterator over one of them is live)."""
    try:
        _parts(None, v, lists)
    except _Refused as e:
        return str(e)
    return None


def rebuild_iterator(tx, v, on_stack: bool, lists: set) -> Out:
    """Out of live iterator `v` (checked by `iterator_refusal`): on the stack (a `for` loop's)
    a LoopRest of its items when taking them is pure, else a LiveRest of its parts where they
    are covered (live_rest.py), else the real iterator."""
    if on_stack:
        _, seq, pure = _parts(None, v, lists)
        if not seq and not pure:
            from ferrodyn.resume.live_rest import live_rest
            live = live_rest(tx, v, lists)
            if live is not None:
                return live
    out, seq, pure = _parts(tx, v, lists)
    if seq:
        if isinstance(out, OutCall) and out.cls is LoopRest:
            return out if on_stack else OutCall(iter, (out,))
        return OutCall(LoopRest, (out,)) if on_stack else OutCall(iter, (OutList(out.items),))
    return OutCall(LoopRest, (out,)) if on_stack and pure else out


def _parts(tx, v, lists: set) -> tuple[Out | None, bool, bool]:
    """(out, seq, pure) of iterator `v`: `out` (None when tx is None: only checking) a
    sequence of its remaining items when `seq`, else a real iterator; `pure`: taking its
    items runs no user code and reads no live container."""
    from ferrodyn.side_effects import MutationType
    from ferrodyn.variables.lists import IteratorVariable, ListVariable
    if not isinstance(v, IteratorVariable):
        raise _Refused(f"{v.describe()} inside a lazy iterator")
    st = v.state
    if isinstance(st.step, _LoopRestStep):
        return (st.step.rest() if tx else None), True, True
    if st.step is None:
        owner = st.owner
        rest = [] if st.exhausted else st.items[st.index:]  # exhausted stays exhausted
        if owner is None or st.exhausted or (owner.mutation_type is MutationType.NEW
                                             and id(st.items) not in lists):
            return (OutTuple(tuple(tx.realize(i).reconstruct(tx) for i in rest)) if tx else None), True, True
        _check_unmutated(owner, "list")
        if st.index > len(st.items):
            raise _Refused("a list iterator past the end of its (shrunk) list")
        out = OutCall(list_iter_at, (ListVariable(state=owner).reconstruct(tx), OutConst(st.index))) if tx else None
        return out, False, False
    if st.rebuild is None:
        raise _Refused("a lazy iterator (itertools chain, pairwise, accumulate, zip_longest, "
                       "...) is live across the break")
    r = st.rebuild()
    if r.refuse:
        raise _Refused(r.refuse)
    if st.exhausted and r.kind in ("reversed", "dict"):
        # CPython's stay exhausted even if their container grows; enumerate, zip, map and
        # filter do not (they ask their inner iterators again): rebuilt from those as they are
        raise _Refused("an exhausted reversed or dict iterator is live across the break")
    return _KINDS[r.kind](tx, r, lists)


def _check_unmutated(state, what: str) -> None:
    from ferrodyn.side_effects import MutationType
    if state.mutation_type is MutationType.EXISTING and state.side_effects is not None and \
            state.side_effects.was_mutated(state):
        raise _Refused(f"an iterator over a {what} from outside the frame that this trace "
                       "mutated (its replay would move the real iterator)")


def _inner(tx, part, lists):
    out, seq, pure = _parts(tx, part, lists)
    return (OutCall(iter, (out,)) if tx and seq else out), pure


def _calls(make, fn_arg: bool, may_raise: bool = False):
    """A kind rebuilt as `make(*fn, *inner iterators, *consts)`, pure when its inner ones
    are, it calls no function and cannot raise (zip(strict=True) raises at its end: taken
    early, the ValueError would come before the loop's remaining iterations)."""
    def kind(tx, r, lists):
        inners = [_inner(tx, p, lists) for p in r.parts]
        pure = not fn_arg and not may_raise and all(p for _, p in inners)
        if not tx:
            return None, False, pure
        fn = (tx.realize(r.args[0]).reconstruct(tx),) if fn_arg else ()
        args = (*fn, *(o for o, _ in inners), *(OutConst(c) for c in r.consts))
        return OutCall(make, args), False, pure
    return kind


def _reversed(tx, r, lists):
    from ferrodyn.side_effects import MutationType
    seq, (i,) = r.args[0], r.consts
    st = seq.state
    if i >= len(st.items):
        raise _Refused("a reversed iterator past the end of its (shrunk) list")
    if st.mutation_type is MutationType.NEW and id(st.items) not in lists:  # a private snapshot
        rest = [st.items[j] for j in range(i, -1, -1)]
        return (OutTuple(tuple(tx.realize(x).reconstruct(tx) for x in rest)) if tx else None), True, True
    _check_unmutated(st, "list")
    return (OutCall(list_reviter_at, (seq.reconstruct(tx), OutConst(i))) if tx else None), False, False


def _dict(tx, r, lists):
    from collections import OrderedDict, defaultdict
    d, (kind, pos, reverse) = r.args[0], r.consts
    if d.state.cls not in (dict, OrderedDict, defaultdict):
        raise _Refused(f"an iterator over a {d.state.cls.__name__} (a dict subclass)")
    _check_unmutated(d.state, "dict")
    if not tx:
        return None, False, False
    return OutCall(dict_iter_at, (d.reconstruct(tx), OutConst(kind), OutConst(pos),
                                  OutConst(reverse))), False, False


_KINDS = {
    "enumerate": _calls(enumerate, False),
    "zip": _calls(zip, False),
    "zip_strict": _calls(zip_strict, False, may_raise=True),
    "map": _calls(map, True),
    "filter": _calls(filter, True),
    "reversed": _reversed,
    "dict": _dict,
}

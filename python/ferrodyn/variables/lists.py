"""Sequence trackers: tuple, list, and iterators, with their methods dispatched by table.

Owns `TupleVariable` (immutable items), `ListVariable` (items in a shared `ListState`, so
aliases of one list see each other's mutations), `IteratorVariable` (position in a shared
`IterState`), and the list/tuple method tables. A list that came from the frame (`existing`)
may be read but not mutated: that would be a side effect the capture cannot replay.
Does not own dicts (dicts.py) or namedtuples (user_objects.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.trace_result import OutList, OutTuple
from ferrodyn.variables.base import instance_has_attr, VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable


def constant_index(index: VariableTracker) -> Any:
    if not index.is_python_constant():
        unsupported(f"sequence index {index.describe()}", BreakReason.DATA_DEPENDENT)
    return index.as_python_constant()


def index_items(items: list, index: VariableTracker):
    key = constant_index(index)
    try:
        return items[key]
    except (IndexError, TypeError) as e:
        unsupported(f"indexing: {type(e).__name__}: {e}", BreakReason.EXCEPTION)


class _SequenceBase(VariableTracker):
    def items_of(self, tx) -> list[VariableTracker]:
        raise NotImplementedError

    def unpack(self, tx):
        return list(self.items_of(tx))

    def length(self, tx):
        return len(self.items_of(tx))

    def truth(self, tx):
        return len(self.items_of(tx)) > 0

    def as_python_constant(self):
        from ferrodyn.variables.base import NotConstant
        from ferrodyn.variables.base import LazyVariable
        vals = []
        for item in self.items_of(None):
            if isinstance(item, LazyVariable):
                raise NotConstant(self)
            vals.append(item.as_python_constant())
        return self.python_type()(vals)

    def fx_arg(self, tx):
        ps, es = [], []
        for item in self.items_of(tx):
            p, e = tx.realize(item).fx_arg(tx)
            ps.append(p)
            es.append(e)
        if self.python_type() is list:
            return ps, es
        return tuple(ps), tuple(es)

    def call_method(self, tx, name, args, kwargs):
        table = _LIST_METHODS if self.python_type() is list else _TUPLE_METHODS
        handler = table.get(name)
        if handler is None:
            unsupported(f"{self.python_type().__name__}.{name}", BreakReason.UNSUPPORTED_CALL)
        return handler(tx, self, *args, **kwargs)

    def var_getattr(self, tx, name):
        from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
        table = _LIST_METHODS if self.python_type() is list else _TUPLE_METHODS
        if name in table:
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        unsupported(f"attribute {name!r} of {self.python_type().__name__}",
                    BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        return instance_has_attr(self.python_type(), name)


@dataclass(frozen=True, eq=False)
class TupleVariable(_SequenceBase):
    items: tuple = ()

    def python_type(self):
        return tuple

    def items_of(self, tx):
        return list(self.items)

    def describe(self):
        return f"tuple of {len(self.items)}"

    def getitem(self, tx, index):
        got = index_items(list(self.items), index)
        return TupleVariable(items=tuple(got)) if isinstance(got, list) else got

    def reconstruct(self, tx):
        if self.source is not None:
            return super().reconstruct(tx)
        return OutTuple(tuple(tx.realize(i).reconstruct(tx) for i in self.items))


@dataclass
class ListState:
    items: list
    existing: bool = False


@dataclass(frozen=True, eq=False)
class ListVariable(_SequenceBase):
    state: ListState = field(default_factory=lambda: ListState([]))

    @staticmethod
    def new(items) -> "ListVariable":
        return ListVariable(state=ListState(list(items)))

    def python_type(self):
        return list

    def identity(self):
        return self.state

    def items_of(self, tx):
        return self.state.items

    def describe(self):
        return f"list of {len(self.state.items)}"

    def mutable(self) -> list:
        if self.state.existing:
            unsupported("mutation of a list from outside the frame", BreakReason.SIDE_EFFECT)
        return self.state.items

    def getitem(self, tx, index):
        got = index_items(self.state.items, index)
        return ListVariable.new(got) if isinstance(got, list) else got

    def setitem(self, tx, index, value):
        items = self.mutable()
        key = constant_index(index)
        try:
            if isinstance(key, slice):
                items[key] = value.unpack(tx)
            else:
                items[key] = value
        except (IndexError, TypeError, ValueError) as e:
            unsupported(f"list assignment: {e}", BreakReason.EXCEPTION)

    def delitem(self, tx, index):
        items = self.mutable()
        try:
            del items[constant_index(index)]
        except (IndexError, TypeError) as e:
            unsupported(f"list deletion: {e}", BreakReason.EXCEPTION)

    def iterator(self, tx):
        return IteratorVariable(state=IterState(self.state.items))

    def reconstruct(self, tx):
        if self.state.existing and self.source is not None:
            return super().reconstruct(tx)
        return OutList(tuple(tx.realize(i).reconstruct(tx) for i in self.state.items))


@dataclass
class IterState:
    items: list  # live list for list iterators
    index: int = 0


@dataclass(frozen=True, eq=False)
class IteratorVariable(VariableTracker):
    state: IterState = field(default_factory=lambda: IterState([]))

    @staticmethod
    def over(items) -> "IteratorVariable":
        return IteratorVariable(state=IterState(list(items)))

    def identity(self):
        return self.state

    def describe(self):
        return "iterator"

    def next(self, tx) -> VariableTracker | None:
        st = self.state
        if st.index >= len(st.items):
            st.index = len(st.items) + 1  # stays exhausted even if the list grows
            return None
        st.index += 1
        return st.items[st.index - 1]

    def iterator(self, tx):
        return self

    def unpack(self, tx):
        out = []
        while (item := self.next(tx)) is not None:
            out.append(item)
        return out


# ---- method tables ------------------------------------------------------------------------

def _const(v):
    return ConstantVariable(value=v)


def _index(tx, seq, value, *rest):
    from ferrodyn.variables.operators import values_equal
    for i, item in enumerate(seq.items_of(tx)):
        if values_equal(tx, tx.realize(item), value):
            return _const(i)
    unsupported("sequence.index: value not found", BreakReason.EXCEPTION)


def _count(tx, seq, value):
    from ferrodyn.variables.operators import values_equal
    return _const(sum(1 for i in seq.items_of(tx) if values_equal(tx, tx.realize(i), value)))


def _append(tx, seq, value):
    seq.mutable().append(value)
    return _const(None)


def _extend(tx, seq, other):
    seq.mutable().extend(other.unpack(tx))
    return _const(None)


def _insert(tx, seq, index, value):
    seq.mutable().insert(constant_index(index), value)
    return _const(None)


def _pop(tx, seq, index=None):
    items = seq.mutable()
    try:
        return items.pop(-1 if index is None else constant_index(index))
    except IndexError as e:
        unsupported(f"list.pop: {e}", BreakReason.EXCEPTION)


def _remove(tx, seq, value):
    i = _index(tx, seq, value).value
    del seq.mutable()[i]
    return _const(None)


def _clear(tx, seq):
    seq.mutable().clear()
    return _const(None)


def _reverse(tx, seq):
    seq.mutable().reverse()
    return _const(None)


def _copy(tx, seq):
    return ListVariable.new(seq.items_of(tx))


def _sort(tx, seq, key=None, reverse=None):
    items = seq.mutable()
    realized = [tx.realize(i) for i in items]
    if key is not None and not (key.is_python_constant() and key.as_python_constant() is None):
        key_fn = tx.realize(key)
        keys = [tx.realize(key_fn.call_function(tx, [i], {})) for i in realized]
    else:
        keys = realized
    if not all(k.is_python_constant() for k in keys):
        unsupported("sorting by non-constant keys", BreakReason.DATA_DEPENDENT)
    rev = bool(reverse.as_python_constant()) if reverse is not None else False
    order = sorted(range(len(realized)), key=lambda n: keys[n].as_python_constant(), reverse=rev)
    items[:] = [realized[n] for n in order]
    return _const(None)


_TUPLE_METHODS: dict[str, Callable] = {"index": _index, "count": _count}
_LIST_METHODS: dict[str, Callable] = {
    **_TUPLE_METHODS, "append": _append, "extend": _extend, "insert": _insert, "pop": _pop,
    "remove": _remove, "clear": _clear, "reverse": _reverse, "copy": _copy, "sort": _sort,
}

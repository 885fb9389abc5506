"""Sequence trackers: tuple, list, and iterators, with their methods dispatched by table.

Owns `TupleVariable` (immutable items), `ListVariable` (items in a shared `ListState`, so
aliases of one list see each other's mutations), `IteratorVariable` (position in a shared
`IterState`; list iterators, `reversed`, `enumerate` and `zip` are lazy over live state, as
CPython's are), and the list/tuple method tables. A list from the frame is EXISTING
(side_effects.MutationType): its mutations are recorded in the SideEffects table and replayed
as `old[:] = new` after the graph call.
Does not own dicts (dicts.py) or namedtuples (user_objects.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.side_effects import MutationType, replace_list
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


@dataclass(eq=False)
class ListState:
    """The contents of one list object (one per object: see SideEffects' identity table)."""
    items: list
    mutation_type: MutationType = MutationType.NEW
    side_effects: Any = None   # the table that records mutations of an EXISTING list
    source: Any = None         # where the entry reaches an EXISTING list
    obj: Any = None            # the real object of an EXISTING container
    version: int = 0           # bumped by every mutation (live iterators check it)

    def on_mutate(self) -> None:
        self.version += 1
        if self.mutation_type is MutationType.EXISTING:
            self.side_effects.mark_mutated(self, self._replay)

    def _replay(self, tx):
        from ferrodyn.trace_result import OutSource
        from ferrodyn.side_effects import value_out
        return replace_list, (OutSource(self.source),
                              OutList(tuple(value_out(tx, i) for i in self.items)))


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
        self.state.on_mutate()
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
        return IteratorVariable(state=IterState(self.state.items, owner=self.state))

    def reconstruct(self, tx):
        st = self.state
        if st.mutation_type is MutationType.EXISTING:
            from ferrodyn.trace_result import OutSource
            return OutSource(st.source)
        return tx.output.side_effects.shared(
            st, lambda: OutList(tuple(tx.realize(i).reconstruct(tx) for i in st.items)))


@dataclass(eq=False)
class IterState:
    """Position of one iterator. Plain: `items` (the live list for list iterators) at `index`;
    lazy ones (reversed, enumerate, zip, dict iterators) produce items with `step(tx)`.
    Once exhausted an iterator stays exhausted, even if its list grows (as in CPython)."""
    items: list
    index: int = 0
    exhausted: bool = False
    step: Callable | None = None
    owner: Any = None  # the ListState a list iterator walks (None: a private snapshot)
    rebuild: Callable[[], "IterRebuild"] | None = None  # a lazy one's parts, for graph breaks


@dataclass(frozen=True)
class IterRebuild:
    """Where a lazy iterator stands, in parts a graph break rebuilds it from (resume/loops.py):
    `kind` (enumerate, zip, zip_strict, map, filter, reversed, dict), `parts` the inner
    IteratorVariables it pulls from, `args` the trackers it reads (map/filter's function, the
    list or dict it walks), `consts` its position; `refuse`: why it cannot be rebuilt exactly."""
    kind: str
    parts: tuple = ()
    args: tuple = ()
    consts: tuple = ()
    refuse: str | None = None


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
        if st.exhausted:
            return None
        if st.step is not None:
            item = st.step(tx)
        elif st.index < len(st.items):
            item = st.items[st.index]
            st.index += 1
        else:
            item = None
        if item is None:
            st.exhausted = True
        return item

    def iterator(self, tx):
        return self

    def unpack(self, tx):
        out = []
        while (item := self.next(tx)) is not None:
            out.append(item)
        return out

    def contains(self, tx, item):
        """`x in it` consumes the iterator up to the first match only, as CPython does."""
        from ferrodyn.variables.operators import values_equal
        while (x := self.next(tx)) is not None:
            if values_equal(tx, tx.realize(x), item):
                return True
        return False


def each_item(tx, iterable: VariableTracker):
    """The items iterating `iterable` produces, taken one at a time as CPython takes them: a
    lazy iterator (a generator) runs only as far as its consumer has got, so a consumer that
    grows a container item by item (`list.extend`, `dict.update`) is seen by the producer."""
    it = tx.realize(iterable).iterator(tx)
    if not isinstance(it, IteratorVariable):
        yield from it.unpack(tx)
        return
    while (item := it.next(tx)) is not None:
        yield item


def reversed_iterator(tx, seq: VariableTracker) -> IteratorVariable:
    """`reversed(seq)`: live for lists (CPython's listreviterator: index from len-1 down,
    stops when the index leaves the list), live and mutation-checked for dicts and their
    views, a snapshot for immutable sequences."""
    from ferrodyn.variables.dicts import DictVariable, DictViewVariable
    seq = tx.realize(seq)
    if isinstance(seq, IteratorVariable):  # no __reversed__, not a sequence
        unsupported(f"TypeError: {seq.describe()} is not reversible", BreakReason.EXCEPTION)
    if isinstance(seq, ListVariable):
        items = seq.state.items
        pos = [len(items) - 1]

        def step(tx):
            i = pos[0]
            if 0 <= i < len(items):
                pos[0] = i - 1
                return items[i]
            return None
        return IteratorVariable(state=IterState([], step=step, rebuild=lambda: IterRebuild(
            "reversed", args=(seq,), consts=(pos[0],))))
    if isinstance(seq, (DictVariable, DictViewVariable)):
        return seq.iterator(tx, reverse=True)
    return IteratorVariable.over(list(reversed(seq.unpack(tx))))


def enumerate_iterator(tx, iterable: VariableTracker, start: int) -> IteratorVariable:
    """`enumerate(iterable, start)`: lazy over the iterable's iterator, as in CPython."""
    inner = tx.realize(iterable).iterator(tx)
    count = [start]

    def step(tx):
        item = inner.next(tx)
        if item is None:
            return None
        count[0] += 1
        return TupleVariable(items=(ConstantVariable(value=count[0] - 1), item))
    return IteratorVariable(state=IterState([], step=step, rebuild=lambda: IterRebuild(
        "enumerate", parts=(inner,), consts=(count[0],))))


def zip_iterator(tx, iterables, strict: bool = False) -> IteratorVariable:
    """`zip(*iterables, strict=...)`: lazy; each step pulls from the iterators in order and
    stops at the first exhausted one, as CPython does (strict: a length mismatch is the
    ValueError eager raises, refused here)."""
    inners = [tx.realize(i).iterator(tx) for i in iterables]

    def step(tx):
        out = []
        for idx, it in enumerate(inners):
            item = it.next(tx)
            if item is None:
                if strict and (idx > 0 or any(o.next(tx) is not None for o in inners[1:])):
                    unsupported("zip(strict=True): arguments of different lengths",
                                BreakReason.EXCEPTION)
                return None
            out.append(item)
        return TupleVariable(items=tuple(out))
    if not inners:
        return IteratorVariable.over([])
    return IteratorVariable(state=IterState([], step=step, rebuild=lambda: IterRebuild(
        "zip_strict" if strict else "zip", parts=tuple(inners))))


def zip_longest_iterator(tx, iterables, fill: VariableTracker) -> IteratorVariable:
    """`itertools.zip_longest`: lazy; each step pulls from every unexhausted iterator in
    order (an exhausted one gives `fill`), until all are exhausted, as CPython does."""
    inners = [tx.realize(i).iterator(tx) for i in iterables]
    done = [False] * len(inners)

    def step(tx):
        out = []
        for idx, it in enumerate(inners):
            item = None if done[idx] else it.next(tx)
            if item is None:
                done[idx] = True
                item = fill
            out.append(item)
        return None if all(done) else TupleVariable(items=tuple(out))
    return IteratorVariable(state=IterState([], step=step))


def pairwise_iterator(tx, iterable: VariableTracker) -> IteratorVariable:
    """`itertools.pairwise`: lazy (one item taken per step after the first pair)."""
    inner = tx.realize(iterable).iterator(tx)
    last: list = []

    def step(tx):
        if not last:
            first = inner.next(tx)
            if first is None:
                return None
            last.append(first)
        item = inner.next(tx)
        if item is None:
            return None
        pair = TupleVariable(items=(last[0], item))
        last[0] = item
        return pair
    return IteratorVariable(state=IterState([], step=step))


def accumulate_iterator(tx, iterable: VariableTracker, combine: Callable,
                        initial: VariableTracker | None) -> IteratorVariable:
    """`itertools.accumulate`: lazy; `combine(tx, total, item)` runs as each item is taken."""
    inner = tx.realize(iterable).iterator(tx)
    total: list = [] if initial is None else [initial]
    started = [False]

    def step(tx):
        if not started[0] and total:
            started[0] = True
            return total[0]
        started[0] = True
        item = inner.next(tx)
        if item is None:
            return None
        total[:] = [combine(tx, total[0], item) if total else item]
        return total[0]
    return IteratorVariable(state=IterState([], step=step))


def map_iterator(tx, fn: VariableTracker, iterables) -> IteratorVariable:
    """`map(fn, *iterables)`: lazy; `fn` runs when an item is taken, as in CPython (so calls
    interleave with the loop body's effects in program order)."""
    pairs = zip_iterator(tx, iterables)

    def step(tx):
        args = pairs.next(tx)
        if args is None:
            return None
        return fn.call_function(tx, list(args.items), {})
    return IteratorVariable(state=IterState([], step=step, rebuild=lambda: IterRebuild(
        "map", parts=pairs.state.rebuild().parts, args=(fn,))))


def filter_iterator(tx, fn: VariableTracker, iterable: VariableTracker) -> IteratorVariable:
    """`filter(fn, iterable)`: lazy, as in CPython (`fn` None: truth of the item)."""
    inner = tx.realize(iterable).iterator(tx)
    identity = fn.is_python_constant() and fn.as_python_constant() is None

    def step(tx):
        while (item := inner.next(tx)) is not None:
            keep = tx.realize(item) if identity else tx.realize(fn.call_function(tx, [item], {}))
            if keep.truth(tx):
                return item
        return None
    return IteratorVariable(state=IterState([], step=step, rebuild=lambda: IterRebuild(
        "filter", parts=(inner,), args=(fn,))))


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
    other = tx.realize(other)
    if isinstance(other, _SequenceBase):  # CPython's fast path: a snapshot (`xs.extend(xs)`)
        seq.mutable().extend(other.unpack(tx))
        return _const(None)
    for item in each_item(tx, other):  # appended one by one, as list_extend does
        seq.mutable().append(item)
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

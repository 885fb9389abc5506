"""`itertools` modelled over trackers, one handler per function in `HANDLERS` (merged into
builtins.BUILTIN_HANDLERS).

Each model follows CPython's `Modules/itertoolsmodule.c` in *when* it takes items from its
inputs and calls user functions, because a generator input or a key function with effects
makes the order observable:
- eager at construction (CPython takes `tuple(iterable)` in `__new__`): combinations,
  combinations_with_replacement, permutations, product; their results are precomputed tuples
  of the input trackers (so an iterator live at a graph break is rebuilt as its remaining items);
- lazy (one input item per output item, predicates and keys run as items are taken): chain,
  chain.from_iterable, islice, takewhile, dropwhile, filterfalse, compress, starmap, cycle,
  groupby (and its groupers), tee, accumulate, pairwise, zip_longest (the last three in lists.py);
- infinite (count, cycle, repeat without times): lazy; taking more than `INFINITE_CAP` items at
  trace time is refused (eager would run forever or run out of memory).
Arguments that steer the iteration (sizes, counts, slice bounds, count's start/step) must be
constants; anything else is refused with CPython's error where eager raises one.
Does not own iterator trackers themselves (lists.IteratorVariable) or their rebuild at a graph
break (resume/loops.py): the lazy ones here have no rebuild, so a break with one live refuses.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.variables import operators as ops
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.lists import (IteratorVariable, IterState, TupleVariable,
                                      accumulate_iterator, pairwise_iterator,
                                      zip_longest_iterator)

INFINITE_CAP = 100_000  # items an infinite iterator may yield at trace time


def _c(v) -> ConstantVariable:
    return ConstantVariable(value=v)


def _const(tx, v: VariableTracker, what: str) -> Any:
    from ferrodyn.variables import sym_int
    v = sym_int.concrete(tx, tx.realize(v))
    if not v.is_python_constant():
        unsupported(f"{what} with a non-constant argument {v.describe()}",
                    BreakReason.DATA_DEPENDENT)
    return v.as_python_constant()


def _lazy(step: Callable) -> IteratorVariable:
    return IteratorVariable(state=IterState([], step=step))


def _iter_of(tx, iterable) -> IteratorVariable:
    it = tx.realize(iterable).iterator(tx)
    return it if isinstance(it, IteratorVariable) else IteratorVariable.over(it.unpack(tx))


def _items(tx, iterable) -> list:
    return tx.realize(iterable).iterator(tx).unpack(tx)


def _truth(tx, v) -> bool:
    return tx.realize(v).truth(tx)


def _call(tx, fn, *args) -> VariableTracker:
    return tx.realize(fn).call_function(tx, list(args), {})


def _is_none(v) -> bool:
    return v is None or (v.is_python_constant() and v.as_python_constant() is None)


def _capped(step: Callable, name: str) -> Callable:
    taken = [0]

    def capped(tx):
        taken[0] += 1
        if taken[0] > INFINITE_CAP:
            unsupported(f"itertools.{name}: more than {INFINITE_CAP} items taken at trace time "
                        "(an unbounded loop)", BreakReason.UNSUPPORTED_BUILTIN)
        return step(tx)
    return capped


def _size(tx, r, what: str, *, optional: bool = False) -> int | None:
    if optional and _is_none(r):
        return None
    n = _const(tx, r, what)
    if not isinstance(n, int):
        unsupported(f"TypeError: {what}: an integer is required", BreakReason.EXCEPTION)
    if n < 0:
        unsupported(f"ValueError: {what}: r must be non-negative", BreakReason.EXCEPTION)
    return n


# ---- eager at construction (CPython: pool = tuple(iterable)) ------------------------------------

def _index_tuples(pool: list, index_tuples) -> IteratorVariable:
    return IteratorVariable.over(TupleVariable(items=tuple(pool[i] for i in t))
                                 for t in index_tuples)


def _combinations(tx, iterable, r):
    pool = _items(tx, iterable)
    return _index_tuples(pool, itertools.combinations(range(len(pool)),
                                                      _size(tx, r, "combinations()")))


def _combinations_with_replacement(tx, iterable, r):
    pool = _items(tx, iterable)
    n = _size(tx, r, "combinations_with_replacement()")
    return _index_tuples(pool, itertools.combinations_with_replacement(range(len(pool)), n))


def _permutations(tx, iterable, r=None):
    pool = _items(tx, iterable)
    n = _size(tx, r, "permutations()", optional=True)
    return _index_tuples(pool, itertools.permutations(range(len(pool)), n))


def _product(tx, *iterables, repeat=None):
    seqs = [_items(tx, it) for it in iterables]
    if repeat is not None:
        seqs = seqs * _size(tx, repeat, "product()")
    return IteratorVariable.over(TupleVariable(items=t) for t in itertools.product(*seqs))


# ---- infinite ---------------------------------------------------------------------------------

def _repeat(tx, *args, **kwargs):
    named = {**dict(zip(("object", "times"), args)), **kwargs}  # CPython takes both by keyword
    obj, times = named.get("object"), named.get("times")
    if obj is None or len(args) + len(kwargs) != len(named) or len(named) > 2:
        unsupported("TypeError: repeat() arguments", BreakReason.EXCEPTION)
    if times is None:
        return _lazy(_capped(lambda tx: obj, "repeat"))
    n = _const(tx, times, "repeat()")
    if not isinstance(n, int):
        unsupported("TypeError: repeat(): times must be an integer", BreakReason.EXCEPTION)
    return IteratorVariable.over([obj] * max(n, 0))


def _count(tx, start=None, step=None):
    """`count(start, step)`: CPython adds `step` to the running value each time (repeated
    addition: the float results are those of `n += step`, not `start + i * step`)."""
    first = 0 if start is None else _const(tx, start, "count()")
    stride = 1 if step is None else _const(tx, step, "count()")
    if not all(isinstance(v, (int, float, complex)) for v in (first, stride)):
        unsupported("count() of non-numbers", BreakReason.UNSUPPORTED_BUILTIN)
    current = [first]

    def step_fn(tx):
        value = current[0]
        current[0] = value + stride
        return _c(value)
    return _lazy(_capped(step_fn, "count"))


def _cycle(tx, iterable):
    """`cycle`: the first pass takes items lazily and saves them, then repeats the saved
    items forever (an empty input: exhausted at once)."""
    inner = _iter_of(tx, iterable)
    saved: list = []
    pos = {"first": True, "i": 0}

    def step(tx):
        if pos["first"]:
            item = inner.next(tx)
            if item is not None:
                saved.append(item)
                return item
            pos["first"] = False
        if not saved:
            return None
        item = saved[pos["i"] % len(saved)]
        pos["i"] += 1
        return item
    return _lazy(_capped(step, "cycle"))


# ---- lazy ---------------------------------------------------------------------------------------

def _chain_over(tx, outer: IteratorVariable) -> IteratorVariable:
    """`chain`: each iterable is iterated (and `iter()` called on it) only when the previous
    one is exhausted, so a generator runs as far as the consumer."""
    current: list = [None]

    def step(tx):
        while True:
            if current[0] is None:
                nxt = outer.next(tx)
                if nxt is None:
                    return None
                current[0] = _iter_of(tx, nxt)
            item = current[0].next(tx)
            if item is not None:
                return item
            current[0] = None
    return _lazy(step)


def _chain(tx, *iterables):
    return _chain_over(tx, IteratorVariable.over(iterables))


def _chain_from_iterable(tx, iterables):
    return _chain_over(tx, _iter_of(tx, iterables))


def _islice(tx, iterable, *args):
    """`islice(it, [start,] stop[, step])`: consumes exactly what CPython's islice_next
    consumes (nothing past `stop`)."""
    if not 1 <= len(args) <= 3:
        unsupported("TypeError: islice expected 2 to 4 arguments", BreakReason.EXCEPTION)
    sl = slice(*[_const(tx, a, "islice()") for a in args])
    start, stop, stride = sl.start or 0, sl.stop, 1 if sl.step is None else sl.step
    if not all(isinstance(v, int) and v >= 0 for v in (start, stride, stop or 0)) or stride < 1:
        unsupported("ValueError: islice() arguments", BreakReason.EXCEPTION)
    it = _iter_of(tx, iterable)
    pos = {"cnt": 0, "next": start}

    def step(tx):
        if stop is not None and pos["next"] >= stop:
            return None
        while pos["cnt"] < pos["next"]:
            if it.next(tx) is None:
                return None
            pos["cnt"] += 1
        item = it.next(tx)
        if item is None:
            return None
        pos["cnt"] += 1
        pos["next"] += stride
        if stop is not None and pos["next"] > stop:
            pos["next"] = stop
        return item
    return _lazy(step)


def _takewhile(tx, predicate, iterable):
    inner = _iter_of(tx, iterable)
    stopped = [False]

    def step(tx):
        if stopped[0]:
            return None
        item = inner.next(tx)
        if item is None:
            return None
        if _truth(tx, _call(tx, predicate, item)):
            return item
        stopped[0] = True
        return None
    return _lazy(step)


def _dropwhile(tx, predicate, iterable):
    inner = _iter_of(tx, iterable)
    dropping = [True]

    def step(tx):
        while (item := inner.next(tx)) is not None:
            if not dropping[0] or not _truth(tx, _call(tx, predicate, item)):
                dropping[0] = False
                return item
        return None
    return _lazy(step)


def _filterfalse(tx, predicate, iterable):
    inner = _iter_of(tx, iterable)

    def step(tx):
        while (item := inner.next(tx)) is not None:
            keep = item if _is_none(predicate) else _call(tx, predicate, item)
            if not _truth(tx, keep):
                return item
        return None
    return _lazy(step)


def _compress(tx, data, selectors):
    items, flags = _iter_of(tx, data), _iter_of(tx, selectors)

    def step(tx):
        while True:  # CPython takes a datum, then a selector
            item = items.next(tx)
            if item is None:
                return None
            flag = flags.next(tx)
            if flag is None:
                return None
            if _truth(tx, flag):
                return item
    return _lazy(step)


def _starmap(tx, function, iterable):
    inner = _iter_of(tx, iterable)

    def step(tx):
        args = inner.next(tx)
        if args is None:
            return None
        return tx.realize(function).call_function(tx, _items(tx, args), {})
    return _lazy(step)


def _keys_equal(tx, a, b) -> bool:
    """`PyObject_RichCompareBool(a, b, Py_EQ)`: identity first, then `==`."""
    return ops.is_same(tx, a, b) or ops.values_equal(tx, tx.realize(a), tx.realize(b))


class _GroupBy:
    """CPython's groupbyobject: `tgtkey`, `currkey`, `currvalue` and the one live grouper."""

    def __init__(self, tx, iterable, key):
        self.it = _iter_of(tx, iterable)
        self.key = None if key is None or _is_none(key) else key
        self.tgtkey = self.currkey = self.currvalue = None
        self.currgrouper = None

    def step(self, tx) -> bool:
        value = self.it.next(tx)
        if value is None:
            return False
        key = value if self.key is None else _call(tx, self.key, value)
        self.currvalue, self.currkey = value, key
        return True

    def next_group(self, tx):
        self.currgrouper = None
        while True:
            if self.currkey is None:
                pass
            elif self.tgtkey is None:
                break
            elif not _keys_equal(tx, self.tgtkey, self.currkey):
                break
            if not self.step(tx):
                return None
        self.tgtkey = self.currkey
        grouper = _lazy(None)
        tgtkey = self.tgtkey
        marker = object()
        self.currgrouper = marker

        def grouper_step(tx):
            if self.currgrouper is not marker:
                return None
            if self.currvalue is None and not self.step(tx):
                return None
            if not _keys_equal(tx, tgtkey, self.currkey):
                return None
            value, self.currvalue, self.currkey = self.currvalue, None, None
            return value
        grouper.state.step = grouper_step
        return TupleVariable(items=(self.currkey, grouper))


def _groupby(tx, iterable, key=None):
    return _lazy(_GroupBy(tx, iterable, key).next_group)


def _tee(tx, iterable, n=None):
    """`tee(it, n)`: n iterators over one shared buffer; the one ahead takes from `it`."""
    count = 2 if n is None else _const(tx, n, "tee()")
    if not isinstance(count, int) or count < 0:
        unsupported("ValueError: tee(): n must be >= 0", BreakReason.EXCEPTION)
    inner = _iter_of(tx, iterable)
    buffer: list = []

    def make():
        pos = [0]

        def step(tx):
            if pos[0] == len(buffer):
                item = inner.next(tx)
                if item is None:
                    return None
                buffer.append(item)
            pos[0] += 1
            return buffer[pos[0] - 1]
        return _lazy(step)
    return TupleVariable(items=tuple(make() for _ in range(count)))


def _accumulate(tx, iterable, func=None, *, initial=None):
    fn = None if func is None or _is_none(func) else tx.realize(func)

    def combine(tx, total, item):
        if fn is None:
            return ops.binary_op(tx, operator.add, total, item)
        return fn.call_function(tx, [total, item], {})
    return accumulate_iterator(tx, iterable, combine, None if _is_none(initial) else initial)


def _pairwise(tx, iterable):
    return pairwise_iterator(tx, iterable)


def _zip_longest(tx, *iterables, fillvalue=None):
    return zip_longest_iterator(tx, iterables, _c(None) if fillvalue is None else fillvalue)


HANDLERS: dict[Any, Callable] = {
    itertools.combinations: _combinations,
    itertools.combinations_with_replacement: _combinations_with_replacement,
    itertools.permutations: _permutations, itertools.product: _product,
    itertools.repeat: _repeat, itertools.count: _count, itertools.cycle: _cycle,
    itertools.chain: _chain, itertools.chain.from_iterable: _chain_from_iterable,
    itertools.islice: _islice, itertools.takewhile: _takewhile,
    itertools.dropwhile: _dropwhile, itertools.filterfalse: _filterfalse,
    itertools.compress: _compress, itertools.starmap: _starmap, itertools.groupby: _groupby,
    itertools.tee: _tee, itertools.accumulate: _accumulate, itertools.pairwise: _pairwise,
    itertools.zip_longest: _zip_longest,
}
# Keywords of the itertools without an introspectable signature (builtins.bad_call_args).
KWARGS_OK = {itertools.product: frozenset({"repeat"}),
             itertools.repeat: frozenset({"object", "times"}),
             itertools.zip_longest: frozenset({"fillvalue"})}

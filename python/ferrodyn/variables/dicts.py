"""Dict trackers (dict, OrderedDict, defaultdict-free) with constant keys, methods by table.

Owns `DictVariable` (items in a shared `DictState` so aliases see mutations; `existing` dicts
from the frame are read-only) and the dict method table. Keys must be Python constants.
Does not own `**kwargs` binding (functions.py) or module `_modules` dicts' guards (builder.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.trace_result import OutDict
from ferrodyn.variables.base import instance_has_attr, VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable


def dict_key(tx, key: VariableTracker) -> Any:
    key = tx.realize(key)
    if not key.is_python_constant():
        unsupported(f"dict key {key.describe()}", BreakReason.UNSUPPORTED_TYPE)
    value = key.as_python_constant()
    try:
        hash(value)
    except TypeError as e:
        unsupported(str(e), BreakReason.EXCEPTION)
    return value


@dataclass
class DictState:
    items: dict
    existing: bool = False
    cls: type = dict


@dataclass(frozen=True, eq=False)
class DictVariable(VariableTracker):
    state: DictState = field(default_factory=lambda: DictState({}))

    @staticmethod
    def new(items: dict, cls: type = dict) -> "DictVariable":
        return DictVariable(state=DictState(dict(items), cls=cls))

    def python_type(self):
        return self.state.cls

    def identity(self):
        return self.state

    def describe(self):
        return f"dict of {len(self.state.items)}"

    def mutable(self) -> dict:
        if self.state.existing:
            unsupported("mutation of a dict from outside the frame", BreakReason.SIDE_EFFECT)
        return self.state.items

    def unpack(self, tx):
        return [ConstantVariable(value=k) for k in self.state.items]

    def length(self, tx):
        return len(self.state.items)

    def truth(self, tx):
        return bool(self.state.items)

    def contains(self, tx, item):
        return dict_key(tx, item) in self.state.items

    def getitem(self, tx, index):
        key = dict_key(tx, index)
        if key not in self.state.items:
            unsupported(f"KeyError: {key!r}", BreakReason.EXCEPTION)
        return self.state.items[key]

    def setitem(self, tx, index, value):
        self.mutable()[dict_key(tx, index)] = value

    def delitem(self, tx, index):
        key = dict_key(tx, index)
        items = self.mutable()
        if key not in items:
            unsupported(f"KeyError: {key!r}", BreakReason.EXCEPTION)
        del items[key]

    def as_python_constant(self):
        from ferrodyn.variables.base import NotConstant, LazyVariable
        out = {}
        for k, v in self.state.items.items():
            if isinstance(v, LazyVariable):
                raise NotConstant(self)
            out[k] = v.as_python_constant()
        return out

    def fx_arg(self, tx):
        ps, es = {}, {}
        for k, v in self.state.items.items():
            ps[k], es[k] = tx.realize(v).fx_arg(tx)
        return ps, es

    def var_getattr(self, tx, name):
        from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
        if name in _DICT_METHODS:
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        unsupported(f"attribute {name!r} of dict", BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        return instance_has_attr(self.state.cls, name)

    def call_method(self, tx, name, args, kwargs):
        handler = _DICT_METHODS.get(name)
        if handler is None:
            unsupported(f"dict.{name}", BreakReason.UNSUPPORTED_CALL)
        return handler(tx, self, *args, **kwargs)

    def reconstruct(self, tx):
        if self.state.existing and self.source is not None:
            return super().reconstruct(tx)
        items = self.state.items
        return OutDict(tuple(items), tuple(tx.realize(v).reconstruct(tx) for v in items.values()),
                       self.state.cls)


def _list(items):
    from ferrodyn.variables.lists import ListVariable
    return ListVariable.new(items)


def _keys(tx, d):
    return _list(ConstantVariable(value=k) for k in d.state.items)


def _values(tx, d):
    return _list(d.state.items.values())


def _items(tx, d):
    from ferrodyn.variables.lists import TupleVariable
    return _list(TupleVariable(items=(ConstantVariable(value=k), v))
                 for k, v in d.state.items.items())


def _get(tx, d, key, default=None):
    k = dict_key(tx, key)
    if k in d.state.items:
        return d.state.items[k]
    return default if default is not None else ConstantVariable(value=None)


_MISSING = object()


def _pop(tx, d, key, default=_MISSING):
    k = dict_key(tx, key)
    items = d.mutable()
    if k in items:
        return items.pop(k)
    if default is _MISSING:
        unsupported(f"KeyError: {k!r}", BreakReason.EXCEPTION)
    return default


def _setdefault(tx, d, key, default=None):
    k = dict_key(tx, key)
    if k not in d.state.items:
        d.mutable()[k] = default if default is not None else ConstantVariable(value=None)
    return d.state.items[k]


def _update(tx, d, other=None, **kwargs):
    items = d.mutable()
    if other is not None:
        other = tx.realize(other)
        if isinstance(other, DictVariable):
            items.update(other.state.items)
        else:
            for pair in other.unpack(tx):
                k, v = tx.realize(pair).unpack(tx)
                items[dict_key(tx, k)] = v
    items.update(kwargs)
    return ConstantVariable(value=None)


def _copy(tx, d):
    return DictVariable.new(d.state.items, d.state.cls)


def _clear(tx, d):
    d.mutable().clear()
    return ConstantVariable(value=None)


def _contains(tx, d, key):
    return ConstantVariable(value=d.contains(tx, key))


def _getitem(tx, d, key):
    return d.getitem(tx, key)


_DICT_METHODS: dict[str, Callable] = {
    "keys": _keys, "values": _values, "items": _items, "get": _get, "pop": _pop,
    "setdefault": _setdefault, "update": _update, "copy": _copy, "clear": _clear,
    "__contains__": _contains, "__getitem__": _getitem,
}

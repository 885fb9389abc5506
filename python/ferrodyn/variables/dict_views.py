"""Set operations on dict views, and mappingproxies over dicts made or changed in the frame.

Owns:
- `view_binary`: `d1.keys() | d2.keys()` and `&`, `-`, `^` with a keys view on either side
  (and `keys_equal_set`: `d.keys() == {...}`).
  CPython makes the result set from the view's dict (`set(dict)`, a presized table), then
  applies the in-place set operation with the other operand (`&` iterates the smaller operand
  and keeps what the other contains). The model repeats exactly those operations on a real set
  of model keys (set_model.py), so membership, size and, where the keys are stable, iteration
  order are eager's; the result is a set tracker (sets.py).
- `MappingProxyVariable`: `types.MappingProxyType(d)` and `view.mapping` for a dict tracker, or a
  mappingproxy from the frame whose dict the trace already tracks (builder.py, the proxy pinned
  by identity): a read-only live view of the same state (a mutation of the dict is seen through
  it, as in CPython), rebuilt as `mappingproxy(<the dict>)`.
Does not own dict trackers or their views' iteration (dicts.py), or other mappingproxies read
from the frame (snapshots, builder.py).
"""

from __future__ import annotations

import operator
import types
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

from ferrodyn.exc import BreakReason
from ferrodyn.trace_result import OutCall
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.dicts import DictVariable, DictViewVariable, key_tracker

_BASE = {operator.ior: operator.or_, operator.iand: operator.and_, operator.isub: operator.sub,
         operator.ixor: operator.xor}
_UPDATE = {operator.or_: "update", operator.sub: "difference_update",
           operator.xor: "symmetric_difference_update"}


def _view_keys(tx, view: DictViewVariable) -> list:
    """The set-model keys of a keys view, in the dict's order."""
    from ferrodyn.variables.set_model import key_of
    if view.kind != "keys":
        unsupported(f"set operation on a dict_{view.kind} view", BreakReason.UNSUPPORTED_TYPE)
    return [key_of(tx, key_tracker(k)) for k in view.dict_var.state.items]


def _operand(tx, v):
    """The other operand as CPython's set code reads it: a set model (merged as a set) or the
    keys it iterates, in order."""
    from ferrodyn.variables.sets import SetVariable, elements
    v = tx.realize(v)
    if isinstance(v, DictViewVariable):
        return _view_keys(tx, v)
    if isinstance(v, SetVariable):
        return v.keys(tx)
    return elements(tx, v)


def view_binary(tx, fn, a: VariableTracker, b: VariableTracker) -> VariableTracker | None:
    """`a op b` with a dict keys view on either side (CPython's dictviews_or/and/sub/xor; the
    view is `self`: for `|`, `&`, `^` a view on the right is swapped to the left, for `-` the
    left operand is made a set whatever it is)."""
    from ferrodyn.variables.set_model import IdKey, note_identity
    from ferrodyn.variables.sets import SetVariable
    base = _BASE.get(fn, fn)
    if base not in (operator.or_, operator.and_, operator.sub, operator.xor):
        return None
    a, b = tx.realize(a), tx.realize(b)
    if not isinstance(a, DictViewVariable) and base is not operator.sub:
        a, b = b, a
    if isinstance(a, DictViewVariable):
        left = _view_keys(tx, a)
        result = set(dict.fromkeys(left))  # set(view's dict): CPython presizes the table
    else:
        left = _operand(tx, a)
        result = set(left) if isinstance(left, (set, frozenset)) else set(left)
    other = _operand(tx, b)
    if base is operator.and_:
        result = _intersect(left, other, isinstance(b, DictViewVariable))
    else:
        getattr(result, _UPDATE[base])(other)
    keys = [*left, *other]
    note_identity(tx, keys)
    stable = not any(isinstance(k, IdKey) for k in keys)
    return SetVariable.adopt(result, order_known=stable)


def keys_equal_set(tx, a, b) -> bool | None:
    """`keys_view == s` (either side) for a set or frozenset `s`: equal as sets of keys (None:
    not such a comparison)."""
    from ferrodyn.variables.set_model import note_identity
    from ferrodyn.variables.sets import _set_operand
    view, other = (a, b) if isinstance(a, DictViewVariable) else (b, a)
    if not isinstance(view, DictViewVariable) or view.kind != "keys":
        return None
    keys = _set_operand(tx, other)
    if keys is None:
        return None
    mine = _view_keys(tx, view)
    note_identity(tx, [*mine, *keys])
    return set(mine) == set(keys)


def _intersect(left: list, other, other_is_view: bool) -> set:
    """`_PyDictView_Intersect(view, other)`: a set `other` at least as big as the view answers
    with `other.intersection(view)`; a bigger view is swapped with the view; then the smaller
    side is iterated, each key kept when the other holds it."""
    if type(other) is set and len(left) <= len(other):
        return other.intersection(left)
    self_keys, it = left, other
    if other_is_view and len(other) > len(left):
        self_keys, it = other, left
    held = set(self_keys)
    out = set()
    for k in it:
        if k in held:
            out.add(k)
    return out


@dataclass(frozen=True, eq=False)
class MappingProxyVariable(VariableTracker):
    """`types.MappingProxyType(d)` / `d.keys().mapping` over a dict tracker: read-only, live."""

    dict_var: DictVariable = None  # type: ignore[assignment]

    def python_type(self):
        return types.MappingProxyType

    def describe(self):
        return f"mappingproxy over {self.dict_var.describe()}"

    def _reader(self, name):
        if name not in _READERS:
            unsupported(f"mappingproxy.{name}", BreakReason.UNSUPPORTED_CALL)
        return name

    def iterator(self, tx, reverse: bool = False):
        return self.dict_var.iterator(tx, reverse)

    def unpack(self, tx):
        return self.dict_var.unpack(tx)

    def length(self, tx):
        return self.dict_var.length(tx)

    def truth(self, tx):
        return self.dict_var.truth(tx)

    def contains(self, tx, item):
        return self.dict_var.contains(tx, item)

    def getitem(self, tx, index):
        return self.dict_var.getitem(tx, index)

    def setitem(self, tx, index, value):
        unsupported("TypeError: 'mappingproxy' object does not support item assignment",
                    BreakReason.EXCEPTION)

    def delitem(self, tx, index):
        unsupported("TypeError: 'mappingproxy' object does not support item deletion",
                    BreakReason.EXCEPTION)

    def has_attr(self, tx, name):
        return hasattr(types.MappingProxyType, name)

    def var_getattr(self, tx, name):
        from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
        return BoundMethodVariable(func=MethodOf(name=self._reader(name)), obj=self)

    def call_method(self, tx, name, args, kwargs):
        self._reader(name)
        if name == "copy":  # mappingproxy.copy(): the mapping's own copy()
            return self.dict_var.call_method(tx, "copy", [], {})
        return self.dict_var.call_method(tx, name, args, kwargs)

    def reconstruct(self, tx):  # one proxy object per entry call, however often reached
        if self.source is not None:  # a proxy from the frame
            from ferrodyn.trace_result import OutSource
            return OutSource(self.source)
        return tx.output.side_effects.shared(self, lambda: OutCall(
            types.MappingProxyType, (self.dict_var.reconstruct(tx),)))


_READERS = frozenset({"keys", "values", "items", "get", "copy", "__contains__", "__getitem__"})


def make_mappingproxy(tx, mapping=None, *rest, **kwargs):
    """`types.MappingProxyType(mapping)` for a dict tracker (another mapping: refused)."""
    if mapping is None or rest or kwargs:
        unsupported("mappingproxy() takes exactly one argument", BreakReason.EXCEPTION)
    m = tx.realize(mapping)
    if isinstance(m, MappingProxyVariable):
        return MappingProxyVariable(dict_var=m.dict_var)
    if not isinstance(m, DictVariable) or m.state.cls not in (dict, OrderedDict, defaultdict):
        unsupported(f"mappingproxy over {m.describe()}", BreakReason.UNSUPPORTED_TYPE)
    return MappingProxyVariable(dict_var=m)


def view_mapping(tx, view: DictViewVariable) -> VariableTracker:
    """`view.mapping`: a mappingproxy over the view's dict."""
    return make_mappingproxy(tx, view.dict_var)


def mappingproxy_equal(tx, a, b) -> bool | None:
    """`==` with a mappingproxy tracker: the mapping's `==` (None: not such a comparison)."""
    from ferrodyn.variables.operators import values_equal
    a, b = tx.realize(a), tx.realize(b)
    if not isinstance(a, MappingProxyVariable) and not isinstance(b, MappingProxyVariable):
        return None
    a = a.dict_var if isinstance(a, MappingProxyVariable) else a
    b = b.dict_var if isinstance(b, MappingProxyVariable) else b
    return values_equal(tx, a, b)


HANDLERS = {types.MappingProxyType: make_mappingproxy}

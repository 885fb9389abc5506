"""Class attributes stored from traced code (`Cls.counter += 1`, `type(self).cache = ...`,
`setattr(Cls, name, v)`): the checks that make such a store exactly `type.__setattr__`, and the
pending values later reads in the same trace see.

Owns `store_on_class` (ClassVariable.setattr) and `pending_class_attr` (the MRO walk that the
attribute lookups of user_objects.py consult first). The record itself and its replay after the
graph live in side_effects.py (`SideEffects.store_class_attr`, `store_class_attr`); reads of
class attributes are guarded where they are built (a Source on the class: `G['Cls'].x`,
`type(L['self']).x`), so a class attribute changed outside the trace recompiles. Does not own
instance attribute stores (user_objects.py) or module attributes (nn_module.py).
"""

from __future__ import annotations

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.user_objects import (
    _ABSENT, _HEAPTYPE, _IMMUTABLETYPE, lookup_class_attr,
)


def pending_class_attr(tx, cls: type, name: str) -> VariableTracker | None:
    """The value this trace stored as `name` on the first class of `cls`'s MRO that has one
    (`Cls.x = v` is pending in the SideEffects table until the replay), None when the lookup
    reaches a class whose real `__dict__` holds `name` first, or no class has it."""
    table = tx.output.side_effects
    for klass in cls.__mro__:
        pending = table.pending_class_attr(klass, name)
        if pending is not None:
            return pending
        if name in klass.__dict__:
            return None
    return None


def store_on_class(tx, cls_var, name: str, value) -> None:
    """`Cls.name = value` (also `type(self).name`, `setattr(Cls, ...)`): recorded in the
    SideEffects table and replayed after the graph with `type.__setattr__`; later reads in
    the trace (through the class, its subclasses, instances, `super()`) see the value.
    Refused: a metaclass with its own `__setattr__`, builtin and extension types, special
    (dunder) names (they change type slots), names that are data descriptors of the
    metaclass, and values that are descriptors themselves (functions bind, properties run)."""
    from ferrodyn.exc import Unsupported
    cls = cls_var.value
    meta = type(cls)
    if lookup_class_attr(meta, "__setattr__") is not type.__setattr__:
        unsupported(f"store on class {cls.__name__}: its metaclass {meta.__name__} has its "
                    f"own __setattr__", BreakReason.SIDE_EFFECT)
    if not cls.__flags__ & _HEAPTYPE or cls.__flags__ & _IMMUTABLETYPE:
        unsupported(f"store on the builtin or extension type {cls.__name__}",
                    BreakReason.SIDE_EFFECT)
    if name.startswith("__") and name.endswith("__"):
        unsupported(f"store of the special attribute {cls.__name__}.{name}",
                    BreakReason.SIDE_EFFECT)
    descr = lookup_class_attr(meta, name)
    if descr is not _ABSENT and hasattr(type(descr), "__set__"):
        unsupported(f"store through the metaclass descriptor {meta.__name__}.{name}",
                    BreakReason.SIDE_EFFECT)
    try:
        vtype = tx.realize(value).python_type()
    except Unsupported:
        vtype = None
    if vtype is None or hasattr(vtype, "__get__"):
        unsupported(f"store of a {getattr(vtype, '__name__', 'value')} on class "
                    f"{cls.__name__} (descriptors and functions on classes are not "
                    f"modelled)", BreakReason.SIDE_EFFECT)
    tx.output.side_effects.store_class_attr(cls, cls_var, name, value)

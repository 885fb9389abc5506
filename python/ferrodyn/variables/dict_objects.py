"""Instances of user subclasses of dict / OrderedDict created while tracing (transformers'
`ModelOutput`: a dataclass subclassing OrderedDict, with `__post_init__`, `__setattr__` and
`__setitem__` overrides, `__getitem__` by str and int, `to_tuple`), and dataclass `Field`s.

Owns `DictObjectVariable` (a new object with two parts, as in CPython: its attributes, as any
new object, and its dict items, a `DictVariable`), `DictPartMethod` (a method of the builtin
dict base reached through the instance: `self.keys()`, `super().__setitem__(k, v)`, the
`__len__`/`__iter__`/`__contains__` slots), how such an object is returned from the frame
(rebuilt with the base type's `__new__` and `__setitem__`, past the overrides), the items of
dict subclass instances from the frame (one mutable tracker per object, replayed through the
base's methods), `dataclasses.fields`, and the builtin handlers of the dict family's
constructors (`defaultdict(...)`, `dict/OrderedDict/defaultdict.fromkeys`, and
`types.MappingProxyType` from dict_views.py). Does not own attribute lookup (user_objects.py)
or dict methods (dicts.py).
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.side_effects import MutationType
from ferrodyn.trace_result import OutCall, OutConst, OutTuple
from ferrodyn.variables.base import VariableTracker, raised_while_tracing, unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.dicts import DictVariable
from ferrodyn.variables.user_objects import _ABSENT, NewObjectVariable, ObjState, lookup_class_attr

# builtin bases whose instances keep their items in the dict part
DICT_BASES = (collections.OrderedDict, dict)


def dict_base(cls: type) -> type | None:
    """The builtin dict type `cls` stores its items as, when instances can be modelled: a
    plain subclass whose instances are created by dict's `__new__`."""
    if not isinstance(cls, type) or not issubclass(cls, dict) or cls in DICT_BASES:
        return None
    if lookup_class_attr(cls, "__new__") is not dict.__new__:
        return None
    return next(b for b in DICT_BASES if issubclass(cls, b))


@dataclass(frozen=True, eq=False)
class DictObjectVariable(NewObjectVariable):
    """A new instance of a dict subclass: attributes in `state`, items in `dict_part`."""

    dict_part: DictVariable = None  # type: ignore[assignment]

    def describe(self):
        return f"new {self.cls.__name__} object (dict subclass)"

    def reconstruct(self, tx):
        names = tuple(self.state.attrs)
        values = tuple(tx.realize(self.state.attrs[n]).reconstruct(tx) for n in names)
        items = self.dict_part.state.items
        keys = tuple(items)
        item_values = tuple(tx.realize(items[k]).reconstruct(tx) for k in keys)
        return OutCall(rebuild_dict_object,
                       (OutConst(self.cls), OutConst(names), OutTuple(values), OutConst(keys),
                        OutTuple(item_values)))


def rebuild_dict_object(cls: type, names: tuple, values: tuple, keys: tuple,
                        item_values: tuple) -> Any:
    """An instance of the dict subclass `cls` with the given items and attributes, made without
    `__init__` and past any `__setitem__`/`__setattr__` override (their effects were traced)."""
    base = dict_base(cls)
    obj = dict.__new__(cls)
    for k, v in zip(keys, item_values):
        base.__setitem__(obj, k, v)
    for name, value in zip(names, values):
        object.__setattr__(obj, name, value)
    return obj


def construct_dict_object(tx, cls: type, args, kwargs) -> VariableTracker:
    """`cls(*args, **kwargs)` for a dict subclass: a new object, then its `__init__` (Python
    code inlined; the builtin one fills the items)."""
    import types
    from ferrodyn.variables.user_objects import class_attr_tracker
    base = dict_base(cls)
    obj = DictObjectVariable(cls=cls, state=ObjState({}),
                             dict_part=DictVariable.new({}, base))
    init = lookup_class_attr(cls, "__init__")
    if init in (dict.__init__, collections.OrderedDict.__init__):
        if args or kwargs:
            from ferrodyn.variables.dicts import _update
            if len(args) > 1:
                unsupported(f"{cls.__name__}() with {len(args)} arguments", BreakReason.EXCEPTION)
            _update(tx, obj.dict_part, *args, **kwargs)
        return obj
    if not isinstance(init, types.FunctionType):
        unsupported(f"{cls.__name__}.__init__ is not Python code", BreakReason.UNSUPPORTED_CALL)
    tx.realize(class_attr_tracker(tx, cls, None, "__init__", init, obj)).call_function(
        tx, args, kwargs)
    return obj


@dataclass(frozen=True, eq=False)
class DictPartMethod(VariableTracker):
    """Method `name` of the builtin dict base, bound to an instance's dict part."""

    dict_part: DictVariable = None  # type: ignore[assignment]
    name: str = ""

    def describe(self):
        return f"dict method {self.name}"

    def call_function(self, tx, args, kwargs):
        from ferrodyn.variables.builtins import SLOT_PROTOCOL
        protocol = SLOT_PROTOCOL.get(self.name)
        if protocol is not None and not kwargs:
            return protocol(tx, self.dict_part, *args)
        return self.dict_part.call_method(tx, self.name, list(args), dict(kwargs))


def dict_part_method(tx, owner_obj: VariableTracker, attr: Any,
                     name: str) -> VariableTracker | None:
    """`attr` (found on a builtin dict base in the MRO) bound to `owner_obj`'s dict part: the
    modelled items of a new object, a read-only view of those of an object from the frame."""
    if getattr(attr, "__objclass__", None) not in DICT_BASES:
        return None
    if isinstance(owner_obj, DictObjectVariable):
        return DictPartMethod(dict_part=owner_obj.dict_part, name=name)
    view = _existing_items(tx, owner_obj)
    return DictPartMethod(dict_part=view, name=name) if view is not None else None


# Methods through which the view of an existing object's items is read and guarded (keys
# guard): a class overriding one of them is not viewed. Items are read through `obj[k]`
# (ItemSource), or, for a class overriding `__getitem__`, through `dict.__getitem__(obj, k)`
# (DictItemSource: the storage, no user code runs in a guard).
_VIEW_READERS = ("keys", "__iter__", "__len__")


def _existing_items(tx, obj: VariableTracker) -> DictVariable | None:
    """The items of a dict subclass instance from the frame (one state per object, so every
    method sees earlier mutations), keys guarded; mutations are replayed through the builtin
    base's own `clear`/`__setitem__`, past the subclass's overrides (their effects were traced).
    None when not viewable: a class overriding how the guards read items, or with `__missing__`
    (a guard reading a key that has gone would run it)."""
    from ferrodyn.guard_spec import GuardKind
    from ferrodyn.source import DictItemSource, ItemSource
    from ferrodyn.variables.base import LazyVariable
    from ferrodyn.variables.constant import is_constant_value
    from ferrodyn.variables.dicts import DictState
    value = getattr(obj, "value", None)
    if obj.source is None or not isinstance(value, dict):
        return None
    side_effects = tx.output.side_effects
    hit = side_effects.dict_parts.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    cls, base = type(value), next(b for b in DICT_BASES if isinstance(value, b))
    if any(lookup_class_attr(cls, m) is not lookup_class_attr(base, m) for m in _VIEW_READERS) \
            or lookup_class_attr(cls, "__missing__") is not _ABSENT:
        return None
    keys = tuple(base.keys(value))
    if not all(is_constant_value(k) for k in keys):
        return None
    tx.output.install_guard(obj.source, GuardKind.DICT_KEYS, keys)
    item_source = ItemSource
    if lookup_class_attr(cls, "__getitem__") is not lookup_class_attr(base, "__getitem__"):
        item_source = DictItemSource
    items = {k: LazyVariable(source=item_source(obj.source, k), value=base.__getitem__(value, k))
             for k in keys}
    part = DictVariable(state=DictState(items, MutationType.EXISTING, cls=base,
                                        side_effects=side_effects, source=obj.source, obj=value,
                                        replay_base=base))
    side_effects.dict_parts[id(value)] = (value, part)
    return part


# ---- dataclasses.fields ---------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class DataclassFieldVariable(VariableTracker):
    """A `dataclasses.Field` of a class (fixed when the class was made: guarded by the type of
    the instance or the identity of the class it was read from). Its attributes are read as
    constants; anything else gives up."""

    value: dataclasses.Field = None  # type: ignore[assignment]

    def python_type(self):
        return dataclasses.Field

    def identity(self):
        return ("obj", id(self.value))

    def describe(self):
        return f"dataclass field {self.value.name}"

    def var_getattr(self, tx, name):
        from ferrodyn.variables.builder import build_unsourced
        try:
            value = getattr(self.value, name)
        except AttributeError as e:
            raised_while_tracing(str(e))
        if value is dataclasses.MISSING:
            return _MissingVariable()
        return build_unsourced(value)


@dataclass(frozen=True, eq=False)
class _MissingVariable(VariableTracker):
    """`dataclasses.MISSING`: only compared by identity."""

    def identity(self):
        return ("obj", id(dataclasses.MISSING))

    def python_type(self):
        return type(dataclasses.MISSING)


def dataclass_fields(tx, obj) -> VariableTracker:
    from ferrodyn.variables.lists import TupleVariable
    v = tx.realize(obj)
    cls = v.as_python_constant() if v.is_python_constant() and isinstance(
        v.as_python_constant(), type) else v.python_type()
    try:
        fields = dataclasses.fields(cls)
    except TypeError as e:
        raised_while_tracing(str(e))
    return TupleVariable(items=tuple(DataclassFieldVariable(value=f) for f in fields))


def _is_dataclass(tx, obj) -> VariableTracker:
    v = tx.realize(obj)
    if v.is_python_constant() and isinstance(v.as_python_constant(), type):
        return ConstantVariable(value=dataclasses.is_dataclass(v.as_python_constant()))
    return ConstantVariable(value=dataclasses.is_dataclass(v.python_type()))


# ---- defaultdict and fromkeys ----------------------------------------------------------------

def construct_defaultdict(tx, /, *args, **kwargs) -> VariableTracker:
    """`defaultdict(factory=None, *args, **kwargs)`: the factory must be callable or None (else
    TypeError, refused), the rest fills the items as `dict.update` does."""
    from ferrodyn.variables.builtins import BUILTIN_HANDLERS
    from ferrodyn.variables.dicts import _is_none, _update
    factory = tx.realize(args[0]) if args else ConstantVariable(value=None)
    if not _is_none(factory) and not BUILTIN_HANDLERS[callable](tx, factory).value:
        unsupported("TypeError: first argument must be callable or None", BreakReason.EXCEPTION)
    d = DictVariable.new({}, collections.defaultdict, factory)
    _update(tx, d, *args[1:], **kwargs)
    return d


def _fromkeys(cls: type):
    """`cls.fromkeys(iterable, value=None)`: `cls()` (a defaultdict without a factory), then
    every key of `iterable`, in its order, set to the one `value` object."""
    def handler(tx, iterable, value=None):
        from ferrodyn.variables.dicts import dict_key
        from ferrodyn.variables.lists import each_item
        value = value if value is not None else ConstantVariable(value=None)
        d = DictVariable.new({}, cls)
        for k in each_item(tx, iterable):
            d.mutable()[dict_key(tx, k)] = value
        return d
    return handler


from ferrodyn.variables import dict_views  # noqa: E402  (its handlers join this table)

HANDLERS = {dataclasses.fields: dataclass_fields, dataclasses.is_dataclass: _is_dataclass,
            **dict_views.HANDLERS,
            collections.defaultdict: construct_defaultdict,
            **{cls.fromkeys: _fromkeys(cls) for cls in (dict, collections.OrderedDict,
                                                        collections.defaultdict)}}

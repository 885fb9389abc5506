"""Trackers for instances and classes of user code: objects from the frame, objects created
while tracing (user classes, dataclasses), and classes (`super()` objects: super_vars.py;
Python modules: py_modules.py; namedtuple instances and torch's structseq results:
namedtuple_vars.py).

Owns attribute lookup as CPython does it: a Python `__getattribute__` override is inlined (never
bypassed; `hasattr` probes it), else the generic lookup (data descriptors and properties on the
type, then the instance `__dict__`, then methods / class attributes, with Sources that read the
instance dict directly, `DictOf(obj)['name']`), then a Python `__getattr__`; `__setattr__`,
`__setitem__`, `__delitem__` overrides of new objects inlined; builtin slots found on the class
bound to the instance; dataclass reconstruction; objects with `__slots__` only (members read through their descriptors, each
read guarded by its source); objects that key dicts by identity (`identity_dict_key`).
Class-attribute stores are checked in class_attrs.py (lookups here consult its pending values
first); torch.nn modules built in the frame, in nn_construct.py.
Does not own nn.Module specifics (nn_module.py) or the builtin types (builtins.py).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import dataclass, field
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.source import AttrSource, DictOfSource, ItemSource, Source, TypeSource
from ferrodyn.trace_result import OutCall, OutTuple
from ferrodyn.variables.base import VariableTracker, raised_while_tracing, unsupported
from ferrodyn.variables.constant import ConstantVariable

_ABSENT = object()


def lookup_class_attr(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _ABSENT


def _sub(source: Source | None, make) -> Source | None:
    return make(source) if source is not None else None


def _lazy(value, source):
    from ferrodyn.variables.functions import _lazy as lazy
    return lazy(value, source)


def pending_class_attr(tx, cls: type, name: str) -> VariableTracker | None:
    from ferrodyn.variables.class_attrs import pending_class_attr as pending
    return pending(tx, cls, name)


def class_attr_tracker(tx, cls: type, cls_source: Source | None, name: str, attr: Any,
                       self_tracker: VariableTracker | None) -> VariableTracker:
    """A class attribute seen through an instance (`self_tracker`) or through the class."""
    from ferrodyn.variables.functions import BoundMethodVariable, UserFunctionVariable
    src = _sub(cls_source, lambda s: AttrSource(s, name))
    if isinstance(attr, staticmethod):
        return _lazy(attr.__func__, src)
    if isinstance(attr, classmethod):
        fn = _lazy(attr.__func__, _sub(src, lambda s: AttrSource(s, "__func__")))
        return BoundMethodVariable(func=fn, obj=ClassVariable(source=cls_source, value=cls))
    if isinstance(attr, (types.FunctionType, functools._lru_cache_wrapper)) and \
            self_tracker is not None:  # (an lru_cache wrapper binds like a function)
        return BoundMethodVariable(func=_lazy(attr, src), obj=self_tracker)
    if isinstance(attr, property) and self_tracker is not None:
        if attr.fget is None:
            unsupported(f"unreadable property {name!r}", BreakReason.EXCEPTION)
        fget = _lazy(attr.fget, _sub(src, lambda s: AttrSource(s, "fget")))
        return tx.realize(fget).call_function(tx, [self_tracker], {})
    if isinstance(attr, types.FunctionType):
        return _lazy(attr, src)
    if isinstance(attr, _SLOT_TYPES) and self_tracker is not None:
        # `object.__getattribute__`, `dict.get`... reached through an instance (`super()` in a
        # `__getattribute__` override): the builtin bound to the instance
        from ferrodyn.variables.builtins import BuiltinVariable, is_builtin_like
        from ferrodyn.variables.dict_objects import dict_part_method
        part = dict_part_method(tx, self_tracker, attr, name)
        if part is not None:
            return part
        if not is_builtin_like(attr):
            unsupported(f"{type(attr).__name__} {cls.__name__}.{name}",
                        BreakReason.UNSUPPORTED_CALL)
        return BoundMethodVariable(func=BuiltinVariable(fn=attr), obj=self_tracker)
    if self_tracker is not None:
        get = lookup_class_attr(type(attr), "__get__")
        if isinstance(get, types.FunctionType):
            # a non-data descriptor of Python code (`__get__` only; `functools.cached_property`):
            # `type(attr).__get__(attr, obj, cls)`, not the value the class itself sees
            return tx.realize(_lazy(get, None)).call_function(
                tx, [_lazy(attr, src), self_tracker, ClassVariable(source=cls_source, value=cls)], {})
        if get is not _ABSENT and not isinstance(attr, types.ClassMethodDescriptorType):
            unsupported(f"descriptor {cls.__name__}.{name} ({type(attr).__name__}) read through "
                        f"an instance", BreakReason.UNSUPPORTED_TYPE)
    return _lazy(getattr(cls, name), src)


def _is_module_getattr(hook) -> bool:
    """nn.Module.__getattr__ consults only the dicts that `fallback_attr` reads, else raises."""
    import torch
    return hook is torch.nn.Module.__getattr__


# Builtin types whose `__getattribute__`/`__setattr__` slots are object's generic ones.
_GENERIC_ATTR_OWNERS = (object, dict, list, tuple, set, int, float, str)
_SLOT_TYPES = (types.WrapperDescriptorType, types.MethodDescriptorType)


def BoundMethodVariable_(fn: types.FunctionType, obj: VariableTracker, slot: str):
    """`fn` bound to `obj` (a slot method found on obj's class, read without a Source: the
    class is guarded by obj's TYPE_MATCH)."""
    from ferrodyn.variables.functions import BoundMethodVariable
    return BoundMethodVariable(func=_lazy(fn, None), obj=obj)


class AttributeAbsent(Exception):
    """Control-flow signal of a `hasattr` probe (ObjectLike._probe_override): the generic lookup
    found no attribute, called directly from the probed `__getattribute__` frame."""


# for each hasattr probe in progress (innermost last), the code objects of the
# `__getattribute__` overrides whose frames may report an absent attribute
_PROBES: list = []


class ObjectLike(VariableTracker):
    """Shared attribute lookup of objects whose attributes live in a `__dict__`."""

    def obj_type(self) -> type:
        raise NotImplementedError

    def instance_attr(self, tx, name: str) -> VariableTracker | None:
        raise NotImplementedError

    def fallback_attr(self, tx, name: str) -> VariableTracker | None:
        return None

    def type_source(self) -> Source | None:
        return _sub(self.source, TypeSource)

    def python_type(self):
        return self.obj_type()

    def var_getattr(self, tx, name):
        """`obj.name`: the class's `__getattribute__` when it overrides object's (inlined when it
        is Python code), else the generic lookup, then the class's `__getattr__`."""
        override = self._override("__getattribute__")
        if override is not None:
            return tx.realize(override).call_function(tx, [ConstantVariable(value=name)], {})
        return self.generic_getattr(tx, name)

    def _override(self, slot: str) -> VariableTracker | None:
        """The bound Python method overriding object's `slot`, None when not overridden;
        refuses when the override is not Python code."""
        cls = self.obj_type()
        attr = lookup_class_attr(cls, slot)
        if attr is _ABSENT or attr is getattr(object, slot, _ABSENT) or \
                getattr(attr, "__objclass__", None) in _GENERIC_ATTR_OWNERS and \
                isinstance(attr, types.WrapperDescriptorType):
            return None
        if not isinstance(attr, types.FunctionType):
            unsupported(f"{cls.__name__}.{slot} is not Python code", BreakReason.UNSUPPORTED_CALL)
        return BoundMethodVariable_(attr, self, slot)

    def generic_getattr(self, tx, name):
        """`object.__getattribute__(obj, name)` (then `__getattr__`, as `slot_tp_getattr_hook`
        does)."""
        cls = self.obj_type()
        if name == "__class__":
            return ClassVariable(source=self.type_source(), value=cls)
        pending = pending_class_attr(tx, cls, name)
        if pending is not None:  # a plain value stored on the class in this trace
            inst = self.instance_attr(tx, name)
            if inst is None:
                self.guard_unshadowed(tx, name)
            return inst if inst is not None else pending
        attr = lookup_class_attr(cls, name)
        is_data_descr = attr is not _ABSENT and (
            isinstance(attr, property) or hasattr(type(attr), "__set__"))
        if is_data_descr and not isinstance(attr, property):
            return self.descriptor_attr(tx, name)
        if attr is _ABSENT or not is_data_descr:
            inst = self.instance_attr(tx, name)
            if inst is not None:
                return inst
        if attr is not _ABSENT:
            if not is_data_descr:  # an instance attribute stored later would shadow it
                self.guard_unshadowed(tx, name)
            return class_attr_tracker(tx, cls, self.type_source(), name, attr, self)
        fb = self.fallback_attr(tx, name)
        if fb is not None:
            return fb
        getattr_hook = lookup_class_attr(cls, "__getattr__")
        if getattr_hook is not _ABSENT:
            from ferrodyn.variables.dict_objects import dict_part_method
            part = dict_part_method(tx, self, getattr_hook, getattr(getattr_hook, "__name__", ""))
            if part is not None:  # `__getattr__ = dict.get` (a "dotdict"): the items' method
                if self.source is not None:
                    self.guard_absence(tx)
                return tx.realize(part).call_function(tx, [ConstantVariable(value=name)], {})
            if _is_module_getattr(getattr_hook) or \
                    not isinstance(getattr_hook, types.FunctionType):
                unsupported(f"{cls.__name__}.__getattr__({name!r})", BreakReason.UNSUPPORTED_CALL)
            if self.source is not None:
                self.guard_absence(tx)
            return tx.realize(BoundMethodVariable_(getattr_hook, self, "__getattr__")).call_function(
                tx, [ConstantVariable(value=name)], {})
        if _PROBES and tx.code in _PROBES[-1]:
            if self.source is not None:
                self.guard_absence(tx)
            raise AttributeAbsent(name)
        if self.source is not None:
            self.guard_absence(tx)
        from ferrodyn.variables.exceptions import raise_attribute_error
        raise_attribute_error(tx, cls, name)

    def _probe_override(self, tx, cls, override, name) -> bool:
        """`hasattr(obj, name)` through a Python `__getattribute__`: CPython runs the override and
        catches AttributeError. The override is inlined; when its own frame asks the generic
        lookup for an absent name, the lookup raises `AttributeAbsent` instead of giving up,
        which ends the probe: False (what the override did until then happened in CPython too).
        Overrides with exception handlers could catch the error themselves: refused."""
        # the overrides along the MRO (one calls the next through super())
        codes = frozenset(k.__dict__["__getattribute__"].__code__ for k in cls.__mro__
                          if isinstance(k.__dict__.get("__getattribute__"), types.FunctionType))
        if any(code.co_exceptiontable for code in codes):
            unsupported(f"hasattr on a {cls.__name__} object (its __getattribute__ handles "
                        f"exceptions)", BreakReason.UNSUPPORTED_CALL)
        _PROBES.append(codes)
        try:
            tx.realize(override).call_function(tx, [ConstantVariable(value=name)], {})
        except AttributeAbsent:
            return False
        finally:
            _PROBES.pop()
        return True

    def guard_absence(self, tx) -> None:
        """An attribute found absent stays absent (objects from the frame guard it)."""

    def guard_unshadowed(self, tx, name: str) -> None:
        """`name` was read from the class (no data descriptor): no instance attribute may shadow
        it on a later call (objects from the frame guard their `__dict__`)."""

    def descriptor_attr(self, tx, name):
        unsupported(f"descriptor attribute {name!r}", BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        cls = self.obj_type()
        override = self._override("__getattribute__")
        if override is not None:
            return self._probe_override(tx, cls, override, name)
        if lookup_class_attr(cls, name) is not _ABSENT or \
                pending_class_attr(tx, cls, name) is not None:
            return True
        found = self.instance_attr(tx, name) is not None or \
            self.fallback_attr(tx, name) is not None
        hook = lookup_class_attr(cls, "__getattr__")
        if not found and hook is not _ABSENT and not _is_module_getattr(hook):
            unsupported(f"hasattr on a {cls.__name__} object (its __getattr__ decides)",
                        BreakReason.UNSUPPORTED_CALL)
        return found

    def _dunder(self, tx, name):
        attr = lookup_class_attr(self.obj_type(), name)
        if attr is _ABSENT or attr is getattr(object, name, _ABSENT):
            return None
        return class_attr_tracker(tx, self.obj_type(), self.type_source(), name, attr, self)

    def call_function(self, tx, args, kwargs):
        call = self._dunder(tx, "__call__")
        if call is None:
            unsupported(f"call of {self.describe()}", BreakReason.UNSUPPORTED_CALL)
        return tx.realize(call).call_function(tx, args, kwargs)

    def iterator(self, tx):
        it = self._dunder(tx, "__iter__")
        if it is None:
            unsupported(f"iteration over {self.describe()}", BreakReason.UNSUPPORTED_TYPE)
        return tx.realize(tx.realize(it).call_function(tx, [], {})).iterator(tx)

    def unpack(self, tx):
        return self.iterator(tx).unpack(tx)

    def length(self, tx):
        fn = self._dunder(tx, "__len__")
        if fn is None:
            unsupported(f"len() of {self.describe()}", BreakReason.UNSUPPORTED_TYPE)
        res = tx.realize(tx.realize(fn).call_function(tx, [], {}))
        return res.as_python_constant()

    def truth(self, tx):
        fn = self._dunder(tx, "__bool__")
        if fn is not None:
            return tx.realize(tx.realize(fn).call_function(tx, [], {})).truth(tx)
        if self._dunder(tx, "__len__") is not None:
            return self.length(tx) > 0
        return True

    def getitem(self, tx, index):
        from ferrodyn.variables import typing_vars
        if typing_vars.is_typing_object(getattr(self, "value", None)):  # `List[Tensor]`: folded
            return typing_vars.subscript(tx, self, index)
        fn = self._dunder(tx, "__getitem__")
        if fn is None:
            unsupported(f"indexing {self.describe()}", BreakReason.UNSUPPORTED_TYPE)
        return tx.realize(fn).call_function(tx, [index], {})

    def setitem(self, tx, index, value):
        fn = self._dunder(tx, "__setitem__")
        if fn is None:
            unsupported(f"item assignment on {self.describe()}", BreakReason.SIDE_EFFECT)
        tx.realize(fn).call_function(tx, [index, value], {})

    def delitem(self, tx, index):
        fn = self._dunder(tx, "__delitem__")
        if fn is None:
            unsupported(f"item deletion on {self.describe()}", BreakReason.SIDE_EFFECT)
        tx.realize(fn).call_function(tx, [index], {})

    def contains(self, tx, item):
        fn = self._dunder(tx, "__contains__")
        if fn is not None:
            return tx.realize(tx.realize(fn).call_function(tx, [item], {})).truth(tx)
        return super().contains(tx, item)


@dataclass(frozen=True, eq=False)
class UserObjectVariable(ObjectLike):
    """An object from outside the frame: attributes readable (guarded on use); stores and
    deletions of plain instance attributes are recorded in the SideEffects table (pending values
    are what later reads see) and replayed after the graph."""

    value: Any = None

    def obj_type(self):
        return type(self.value)

    def identity(self):
        return ("obj", id(self.value))

    def describe(self):
        return f"{type(self.value).__name__} object"

    def instance_attr(self, tx, name):
        from ferrodyn.side_effects import DELETED
        pending = tx.output.side_effects.pending_attr(self.value, name)
        if pending is DELETED:
            return None
        if pending is not None:
            return pending
        d = getattr(self.value, "__dict__", None)
        as_dict = tx.output.side_effects.tracked(d, None) if isinstance(d, dict) else None
        if as_dict is not None and hasattr(as_dict, "state"):
            return as_dict.state.items.get(name)  # the __dict__ is a dict tracker: it is the truth
        if isinstance(d, dict) and name in d:
            return _lazy(d[name], _sub(self.source, lambda s: ItemSource(DictOfSource(s), name)))
        return None

    def has_attr(self, tx, name):
        member = lookup_class_attr(type(self.value), name)
        if isinstance(member, types.MemberDescriptorType) and \
                self._override("__getattribute__") is None:
            # a `__slots__` member: present only once assigned (absence cannot be guarded)
            if not hasattr(self.value, name) or self.source is None:
                unsupported(f"hasattr on the unset (or unsourced) slot {name!r} of a "
                            f"{type(self.value).__name__} object", BreakReason.UNSUPPORTED_TYPE)
            tx.realize(self.descriptor_attr(tx, name))  # guards the member's value
            return True
        found = super().has_attr(tx, name)
        if self.source is not None and (not found or self._found_in_instance(tx, name)):
            self.guard_absence(tx)  # the key sets decide, whichever the answer
        return found

    def _found_in_instance(self, tx, name) -> bool:
        """Whether `hasattr` found `name` in the object's own dicts (which can lose it on a
        later call) rather than on its class."""
        return lookup_class_attr(type(self.value), name) is _ABSENT

    def guard_absence(self, tx):
        """An attribute found absent stays absent, one found present stays present: guard the
        instance dict's keys (and, for modules, those of the dicts `nn.Module.__getattr__`
        consults)."""
        from ferrodyn.guard_spec import GuardKind
        d = getattr(self.value, "__dict__", None)
        if not isinstance(d, dict):
            return
        src = DictOfSource(self.source)
        tx.output.install_guard(src, GuardKind.DICT_KEYS, tuple(d))
        for sub in ("_parameters", "_buffers", "_modules"):
            if isinstance(d.get(sub), dict):
                tx.output.install_guard(ItemSource(src, sub), GuardKind.DICT_KEYS, tuple(d[sub]))

    def guard_unshadowed(self, tx, name):
        from ferrodyn.guard_spec import GuardKind
        d = getattr(self.value, "__dict__", None)
        if self.source is None or not isinstance(d, dict) or name in d:
            return  # no instance dict, or the key is there now (this trace deleted it)
        tx.output.install_guard(DictOfSource(self.source), GuardKind.DICT_LACKS, name)

    # -- mutation (recorded, replayed with object.__setattr__ / object.__delattr__) -----------
    def plain_setattr_check(self, tx, name: str, verb: str) -> None:
        """Refuse unless `setattr`/`delattr` of `name` is exactly `object.__setattr__`'s: the
        class has no custom `__setattr__`/`__delattr__` and no data descriptor for `name`, and
        the instance has a `__dict__`."""
        cls = type(self.value)
        hook = "__setattr__" if verb == "set" else "__delattr__"
        if lookup_class_attr(cls, hook) is not getattr(object, hook):
            unsupported(f"{cls.__name__}.{hook} (a custom {hook} is not modelled)",
                        BreakReason.SIDE_EFFECT)
        self._plain_slot_check(tx, name)

    def _plain_slot_check(self, tx, name: str) -> None:
        cls = type(self.value)
        attr = lookup_class_attr(cls, name)
        if attr is not _ABSENT and (isinstance(attr, property) or hasattr(type(attr), "__set__")
                                    or hasattr(type(attr), "__delete__")):
            unsupported(f"assignment through descriptor {cls.__name__}.{name}",
                        BreakReason.SIDE_EFFECT)
        if not isinstance(getattr(self.value, "__dict__", None), dict):
            unsupported(f"{cls.__name__} object without a __dict__", BreakReason.SIDE_EFFECT)
        if self.source is None:
            unsupported(f"mutation of a {cls.__name__} object that cannot be reached from the "
                        f"frame", BreakReason.SIDE_EFFECT)

    def setattr(self, tx, name, value):
        override = self._override("__setattr__")
        if override is not None:  # a Python __setattr__ runs, as in CPython (inlined)
            tx.realize(override).call_function(tx, [ConstantVariable(value=name), value], {})
            return
        self.plain_setattr_check(tx, name, "set")
        self.record_store(tx, name, value)

    def raw_setattr(self, tx, name, value):
        """`object.__setattr__(obj, name, value)`: past any `__setattr__` override; a data
        descriptor for `name` would run (refused)."""
        self._plain_slot_check(tx, name)
        self.record_store(tx, name, value)

    def delattr(self, tx, name):
        self.plain_setattr_check(tx, name, "del")
        self.record_delete(tx, name)

    def _dict_tracker(self, tx):
        """The dict tracker of this object's `__dict__` when the trace already holds one
        (`obj.__dict__` was read as a dict): it is then the one truth for the attributes."""
        d = getattr(self.value, "__dict__", None)
        as_dict = tx.output.side_effects.tracked(d, None) if isinstance(d, dict) else None
        return as_dict if as_dict is not None and hasattr(as_dict, "state") else None

    def record_store(self, tx, name, value):
        from ferrodyn.side_effects import DELETED
        from ferrodyn.trace_result import OutSource
        as_dict = self._dict_tracker(tx)
        if as_dict is not None:
            # `object.__setattr__` without a descriptor is `obj.__dict__[name] = value`: the
            # store goes to the dict tracker (recorded and replayed as that dict's mutation)
            key = ConstantVariable(value=name)
            if value is DELETED:
                as_dict.delitem(tx, key)
            else:
                as_dict.setitem(tx, key, value)
            return
        src = self.source
        tx.output.side_effects.store_attr(self.value, lambda tx: OutSource(src), name, value)

    def record_delete(self, tx, name):
        from ferrodyn.side_effects import DELETED
        if self.instance_attr(tx, name) is None:
            unsupported(f"AttributeError: {name!r}", BreakReason.EXCEPTION)
        self.record_store(tx, name, DELETED)

    def descriptor_attr(self, tx, name):
        cls = type(self.value)
        attr = lookup_class_attr(cls, name)
        get = lookup_class_attr(type(attr), "__get__") if attr is not _ABSENT else _ABSENT
        if isinstance(get, types.FunctionType):
            # a data descriptor of Python code: its `__get__` runs in the trace, so it sees
            # what this frame changed (reading it now would return the state before the frame)
            return tx.realize(_lazy(get, None)).call_function(
                tx, [_lazy(attr, _sub(self.type_source(), lambda s: AttrSource(s, name))), self,
                     ClassVariable(source=self.type_source(), value=cls)], {})
        try:
            value = getattr(self.value, name)
        except AttributeError as e:
            raised_while_tracing(str(e))
        return _lazy(value, _sub(self.source, lambda s: AttrSource(s, name)))


@dataclass(eq=False)
class ObjState:
    attrs: dict
    dict_view: Any = None  # the DictState behind `obj.__dict__`, made on first use


@dataclass(frozen=True, eq=False)
class NewObjectVariable(ObjectLike):
    """An instance of a user class created while tracing; its attributes are trackers."""

    cls: type = object
    state: ObjState = field(default_factory=lambda: ObjState({}))
    cls_source: Source | None = None  # where the class was reached (class attributes guarded)

    def obj_type(self):
        return self.cls

    def type_source(self):
        return self.cls_source

    def identity(self):
        return self.state

    def describe(self):
        return f"new {self.cls.__name__} object"

    def instance_attr(self, tx, name):
        return self.state.attrs.get(name)

    def setattr(self, tx, name, value):
        override = self._override("__setattr__")
        if override is not None:
            tx.realize(override).call_function(tx, [ConstantVariable(value=name), value], {})
            return
        self.raw_setattr(tx, name, value)

    def descriptor_attr(self, tx, name):
        if name == "__dict__":  # a live view of the attributes: one dict per object
            from ferrodyn.variables.dicts import DictState, DictVariable
            if self.state.dict_view is None:
                self.state.dict_view = DictState(self.state.attrs)
            return DictVariable(state=self.state.dict_view)
        return super().descriptor_attr(tx, name)

    def raw_setattr(self, tx, name, value):
        attr = lookup_class_attr(self.cls, name)
        if attr is not _ABSENT and hasattr(type(attr), "__set__"):
            unsupported(f"assignment through descriptor {name!r}", BreakReason.UNSUPPORTED_TYPE)
        self.state.attrs[name] = value

    def reconstruct(self, tx):
        """Rebuilt without running `__init__` again (its effects were traced): a new instance
        gets the traced attributes. Only for classes with a plain `__dict__`."""
        from ferrodyn.trace_result import OutConst
        if "__slots__" in vars(self.cls) or lookup_class_attr(self.cls, "__new__") not in \
                (object.__new__, _ABSENT):
            unsupported(f"returning a {self.cls.__name__} object created in the frame",
                        BreakReason.UNSUPPORTED_TYPE)
        def build():
            names = tuple(self.state.attrs)
            values = tuple(tx.realize(self.state.attrs[n]).reconstruct(tx) for n in names)
            return OutCall(rebuild_object, (OutConst(self.cls), OutConst(names), OutTuple(values)))
        return tx.output.side_effects.shared(self.state, build)  # one object however reached


def rebuild_object(cls: type, names: tuple, values: tuple) -> Any:
    """An instance of `cls` with the given attributes, made without calling `__init__`
    (used by generated entry functions to return objects created in a traced frame)."""
    obj = object.__new__(cls)
    for name, value in zip(names, values):
        object.__setattr__(obj, name, value)
    return obj


def is_identity_hashed(value: Any) -> bool:
    """`value` hashes and compares by identity (its type keeps object's `__hash__`/`__eq__`:
    classes without a metaclass override, functions, `typing.Union`...): as a dict key it can
    be held as the object itself, and the DICT_KEYS guard matches it by identity."""
    t = type(value)
    return t.__hash__ is object.__hash__ and t.__eq__ is object.__eq__


def identity_dict_key(tx, key: VariableTracker) -> Any:
    """The object behind `key` when it can key a dict by identity (an object from the frame
    whose type hashes by identity), its identity guarded (ID_MATCH: a lookup's outcome depends
    on which object it is); `_ABSENT` otherwise."""
    if not isinstance(key, UserObjectVariable) or not is_identity_hashed(key.value):
        return _ABSENT
    if key.source is None:
        unsupported(f"a {type(key.value).__name__} object of unknown origin as a dict key",
                    BreakReason.UNSUPPORTED_TYPE)
    from ferrodyn.guard_spec import GuardKind
    tx.output.install_guard(key.source, GuardKind.ID_MATCH, key.value)
    return key.value


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined by a class statement
_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE (3.10+): a type whose attributes are fixed


def is_slots_class(cls: Any) -> bool:
    """Instances of `cls` keep their attributes in `__slots__` members only (no `__dict__`):
    every class of its MRO but `object` is a Python class that declares `__slots__`
    (`dataclasses.Field`, `@dataclass(slots=True)` classes). Such an object is read through its
    member descriptors (`descriptor_attr`), each read guarded by its source."""
    if not isinstance(cls, type) or issubclass(cls, (type, BaseException, tuple)):
        return False
    mro = cls.__mro__
    return mro[-1] is object and len(mro) > 1 and all(
        k.__flags__ & _HEAPTYPE and "__slots__" in vars(k) and "__dict__" not in vars(k)
        for k in mro[:-1])


def is_namedtuple_class(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


@dataclass(frozen=True, eq=False)
class ClassVariable(VariableTracker):
    """A user class (or any class no other tracker models)."""

    value: type = object

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value

    def identity(self):
        return ("obj", id(self.value))

    def describe(self):
        return f"class {self.value.__name__}"

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(value=getattr(self.value, name))
        pending = pending_class_attr(tx, self.value, name)
        if pending is not None:
            return pending
        if name == "apply":  # a custom torch.autograd.Function's apply
            from ferrodyn.variables.autograd_function import apply_of_class
            var = apply_of_class(tx, self, name)
            if var is not None:
                return var
        attr = lookup_class_attr(self.value, name)
        if attr is _ABSENT:
            unsupported(f"AttributeError: class {self.value.__name__} has no {name!r}",
                        BreakReason.EXCEPTION)
        return class_attr_tracker(tx, self.value, self.source, name, attr, None)

    def has_attr(self, tx, name):
        return pending_class_attr(tx, self.value, name) is not None or hasattr(self.value, name)

    def call_function(self, tx, args, kwargs):
        return construct_instance(tx, self.value, args, kwargs, cls_source=self.source)

    def setattr(self, tx, name, value):
        from ferrodyn.variables.class_attrs import store_on_class
        store_on_class(tx, self, name, value)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        return OutConst(self.value) if self.source is None else super().reconstruct(tx)


def construct_instance(tx, cls: type, args, kwargs,
                       cls_source: Source | None = None) -> VariableTracker:
    """`cls(*args, **kwargs)` for a user class: namedtuples are built directly; other classes
    get a new object and their `__init__` inlined."""
    import torch
    from ferrodyn.variables.functions import bind_args
    if is_namedtuple_class(cls):
        new = cls.__new__
        code = new.__code__
        defaults = tuple(ConstantVariable(value=d) for d in (new.__defaults__ or ()))
        bound = bind_args(code, cls.__name__, [ClassVariable(value=cls), *args], kwargs,
                          defaults, {})
        from ferrodyn.variables.namedtuple_vars import NamedTupleVariable
        return NamedTupleVariable.make(cls, [bound[f] for f in cls._fields])
    from ferrodyn.variables import exceptions
    if exceptions.can_make(cls):
        return exceptions.make(tx, cls, args, kwargs)
    from ferrodyn.variables.nn_construct import (
        construct_stateless_torch_module, is_stateless_torch_module_class)
    if issubclass(cls, torch.nn.Module) and is_stateless_torch_module_class(cls):
        return construct_stateless_torch_module(tx, cls, args, kwargs)
    if issubclass(cls, (torch.nn.Module, torch.Tensor, BaseException)):
        unsupported(f"creating a {cls.__name__} inside the traced code",
                    BreakReason.UNSUPPORTED_CALL)
    from ferrodyn.variables.dict_objects import construct_dict_object, dict_base
    if dict_base(cls) is not None and type(cls).__call__ is type.__call__:
        return construct_dict_object(tx, cls, args, kwargs)
    from ferrodyn.variables.dunder_new import construct_with_new, has_python_new
    if has_python_new(cls):  # type_call: the user's __new__, then __init__ if it made a cls
        return construct_with_new(tx, cls, args, kwargs, cls_source)
    if lookup_class_attr(cls, "__new__") not in (object.__new__, _ABSENT) or \
            type(cls).__call__ is not type.__call__:  # ABCMeta is fine: it creates like type
        unsupported(f"{cls.__name__}.__new__ / metaclass", BreakReason.UNSUPPORTED_CALL)
    obj = NewObjectVariable(cls=cls, state=ObjState({}), cls_source=cls_source)
    init = lookup_class_attr(cls, "__init__")
    if init is object.__init__:
        if args or kwargs:
            unsupported(f"{cls.__name__}() takes no arguments", BreakReason.EXCEPTION)
        return obj
    if not isinstance(init, types.FunctionType):
        unsupported(f"{cls.__name__}.__init__ is not Python code", BreakReason.UNSUPPORTED_CALL)
    # through the class's Source when it has one: `__init__`'s globals then have Sources
    tx.realize(class_attr_tracker(tx, cls, cls_source, "__init__", init, obj)).call_function(
        tx, args, kwargs)
    return obj

"""Namedtuple classes made inside the traced frame: `collections.namedtuple(...)` called there.

Eagerly every call of the frame makes a *new* class. The converter makes one class at trace time
(`collections.namedtuple` itself, with constant arguments and the calling frame's `__name__` as
`module`, as CPython's `sys._getframe(1)` lookup gives) so that field access, `_make`,
`_replace`, `isinstance` and methods are traced against real class attributes; that class never
leaves the trace. What escapes (the class itself, or an instance returned or stored) is rebuilt
by the entry from a class it makes on *each* call with the same arguments (once per call,
shared by every escaping use), so `type(f(x)) is type(f(y))` is False, as eagerly.
Owns `MadeClass` (the arguments a class was made from), the registry of trace-time classes,
`FrameNamedTupleClassVariable` and the `collections.namedtuple` handler; and
`NamedTupleVariable`, the tracker of namedtuple instances and of torch's structseq results
(`torch.return_types.max`): field reads, Python overrides of tuple's dunders inlined, and
reconstruction (a class made in the frame is the entry's own, `made_class_out`).
Does not own classes and other instances (user_objects.py).
"""

from __future__ import annotations

import collections
import types
import weakref
from dataclasses import dataclass
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.source import Source, TypeSource
from ferrodyn.trace_result import OutCall, OutConst, OutTuple
from ferrodyn.variables.base import instance_has_attr, unsupported
from ferrodyn.variables.constant import is_constant_value
from ferrodyn.variables.lists import TupleVariable
from ferrodyn.variables.user_objects import (_ABSENT, ClassVariable, _sub, class_attr_tracker,
                                             lookup_class_attr, pending_class_attr)


@dataclass(frozen=True, eq=False)
class MadeClass:
    """The arguments of one `collections.namedtuple` call made in the frame."""
    typename: str
    field_names: tuple
    rename: bool
    defaults: tuple | None
    module: str

    def make(self) -> type:
        return collections.namedtuple(self.typename, self.field_names, rename=self.rename,
                                      defaults=self.defaults, module=self.module)


_TUPLEGETTER = type(collections.namedtuple("_P", "x").x)  # a field's slot reader
_MADE: "weakref.WeakKeyDictionary[type, MadeClass]" = weakref.WeakKeyDictionary()


def made_in_frame(cls: Any) -> MadeClass | None:
    try:
        return _MADE.get(cls)
    except TypeError:
        return None


def made_class_out(tx, cls: type):
    """The Out of the class the entry makes in place of trace-time class `cls` (None: `cls`
    was not made in a traced frame)."""
    spec = made_in_frame(cls)
    if spec is None:
        return None
    return tx.output.side_effects.shared(spec, lambda: OutCall(
        collections.namedtuple,
        tuple(OutConst(v) for v in (spec.typename, spec.field_names, spec.rename,
                                    spec.defaults, spec.module)),
        kwnames=("rename", "defaults", "module")))


@dataclass(frozen=True, eq=False)
class FrameNamedTupleClassVariable(ClassVariable):
    """A namedtuple class made by this trace (its `value` is the trace-time class)."""

    def describe(self):
        return f"namedtuple class {self.value.__name__} made in the frame"

    def reconstruct(self, tx):
        return made_class_out(tx, self.value)

    def setattr(self, tx, name, value):
        unsupported(f"setattr {name!r} on a namedtuple class made in the frame",
                    BreakReason.SIDE_EFFECT)


def tracker_of(cls: type) -> FrameNamedTupleClassVariable | None:
    return FrameNamedTupleClassVariable(value=cls) if made_in_frame(cls) is not None else None


def _const(tx, v, what: str, *, copies_ok: bool = False) -> Any:
    v = tx.realize(v)
    if not v.is_python_constant():
        unsupported(f"namedtuple(): non-constant {what} ({v.describe()})",
                    BreakReason.UNSUPPORTED_BUILTIN)
    value = v.as_python_constant()
    if not copies_ok and not is_constant_value(value):
        unsupported(f"namedtuple(): {what} is a mutable value", BreakReason.UNSUPPORTED_BUILTIN)
    return value


def _namedtuple(tx, typename, field_names, *, rename=None, defaults=None, module=None):
    name = _const(tx, typename, "typename")
    fields = _const(tx, field_names, "field_names", copies_ok=True)  # read, never kept
    if not isinstance(fields, str):
        fields = tuple(fields)
    flag = False if rename is None else _const(tx, rename, "rename")
    dflt = None if defaults is None else _const(tx, defaults, "defaults", copies_ok=True)
    if dflt is not None:
        dflt = tuple(dflt)
        if not all(is_constant_value(d) for d in dflt):  # kept in __new__.__defaults__
            unsupported("namedtuple(): a mutable default", BreakReason.UNSUPPORTED_BUILTIN)
    mod = _const(tx, module, "module") if module is not None else \
        tx.f_globals.get("__name__", "__main__")
    spec = MadeClass(name, fields, bool(flag), dflt, mod)
    try:
        cls = spec.make()
    except (TypeError, ValueError) as e:
        unsupported(f"{type(e).__name__}: {e}", BreakReason.EXCEPTION)
    _MADE[cls] = spec
    return FrameNamedTupleClassVariable(value=cls)


def item_sources(cls: type, source, n: int) -> list:
    """Where the entry reads the items of a namedtuple from the frame: `t[i]`, or `t.field`
    (the field's `_tuplegetter` reads the slot) when the class overrides `__getitem__` (`t[i]`
    would run it and hand the graph its result, not the item)."""
    from ferrodyn.source import AttrSource, ItemSource
    from ferrodyn.variables.user_objects import lookup_class_attr
    if lookup_class_attr(cls, "__getitem__") is tuple.__getitem__:
        return [ItemSource(source, i) for i in range(n)]
    fields = tuple(getattr(cls, "_fields", ()))
    if len(fields) != n or not all(type(lookup_class_attr(cls, f)) is _TUPLEGETTER
                                   for f in fields):
        unsupported(f"a {cls.__name__} whose __getitem__ is overridden and whose fields are not "
                    "plain slots", BreakReason.UNSUPPORTED_TYPE)
    return [AttrSource(source, f) for f in fields]


HANDLERS = {collections.namedtuple: _namedtuple}


@dataclass(frozen=True, eq=False)
class NamedTupleVariable(TupleVariable):
    """A namedtuple, or one of torch's structseq results (`torch.return_types.max`)."""

    cls: type = tuple
    structseq: bool = False

    @staticmethod
    def make(cls: type, items, source: Source | None = None) -> "NamedTupleVariable":
        return NamedTupleVariable(source=source, items=tuple(items), cls=cls,
                                  structseq=not hasattr(cls, "_fields"))

    def python_type(self):
        return self.cls

    def describe(self):
        return f"{self.cls.__name__} tuple"

    def _fields(self) -> tuple:
        if hasattr(self.cls, "_fields"):
            return tuple(self.cls._fields)
        return tuple(getattr(self.cls, "__match_args__", ()))

    def var_getattr(self, tx, name):
        fields = self._fields()
        if name in fields:
            return self.items[fields.index(name)]
        pending = pending_class_attr(tx, self.cls, name)
        if pending is not None:
            return pending
        attr = lookup_class_attr(self.cls, name)
        if attr is not _ABSENT and not isinstance(attr, types.MemberDescriptorType):
            return class_attr_tracker(tx, self.cls, _sub(self.source, TypeSource), name, attr,
                                      self)
        return super().var_getattr(tx, name)

    def has_attr(self, tx, name):
        return name in self._fields() or instance_has_attr(self.cls, name)

    def _user_dunder(self, tx, name: str, args: list):
        """The class's own `name` (a Python override of tuple's) called on this tuple, else
        None (tuple's behaviour)."""
        attr = lookup_class_attr(self.cls, name)
        if not isinstance(attr, types.FunctionType):
            return None
        method = class_attr_tracker(tx, self.cls, _sub(self.source, TypeSource), name, attr, self)
        return tx.realize(tx.realize(method).call_function(tx, args, {}))

    def getitem(self, tx, index):
        got = self._user_dunder(tx, "__getitem__", [index])
        return got if got is not None else super().getitem(tx, index)

    def iterator(self, tx):
        it = self._user_dunder(tx, "__iter__", [])
        return it if it is not None else super().iterator(tx)

    def unpack(self, tx):
        it = self._user_dunder(tx, "__iter__", [])
        return it.unpack(tx) if it is not None else super().unpack(tx)

    def length(self, tx):
        n = self._user_dunder(tx, "__len__", [])
        if n is None:
            return super().length(tx)
        if not (n.is_python_constant() and type(n.as_python_constant()) is int):
            unsupported(f"{self.cls.__name__}.__len__ returned {n.describe()}",
                        BreakReason.UNSUPPORTED_TYPE)
        return n.as_python_constant()

    def truth(self, tx):
        if isinstance(lookup_class_attr(self.cls, "__bool__"), types.FunctionType):
            return self._user_dunder(tx, "__bool__", []).truth(tx)
        return self.length(tx) > 0

    def contains(self, tx, item):
        r = self._user_dunder(tx, "__contains__", [item])
        return r.truth(tx) if r is not None else super().contains(tx, item)

    def as_python_constant(self):
        if made_in_frame(self.cls) is not None:  # its class is the entry's own, made per call
            from ferrodyn.variables.base import NotConstant
            raise NotConstant(self)
        vals = TupleVariable(items=self.items).as_python_constant()
        return self.cls(vals) if self.structseq else self.cls(*vals)

    def fx_arg(self, tx):
        p, e = super().fx_arg(tx)
        return p, (self.cls(e) if self.structseq else self.cls(*e))

    def reconstruct(self, tx):
        if self.source is not None:
            return super().reconstruct(tx)
        items = tuple(tx.realize(i).reconstruct(tx) for i in self.items)
        if self.structseq:
            return OutCall(self.cls, (OutTuple(items),))
        made = made_class_out(tx, self.cls)  # a class made in the frame: the entry's own one
        if made is not None:
            return OutCall(tuple.__new__, (made, OutTuple(items)))
        # `_make` builds with tuple.__new__: no user `__new__` frame runs (which would be
        # intercepted and, inside that very frame's entry, recurse)
        return OutCall(self.cls._make, (OutTuple(items),))

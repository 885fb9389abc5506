"""Creating instances of user classes that define `__new__`, and `object.__new__(cls)`.

`cls(*args, **kwargs)` follows CPython's `type_call`: `obj = cls.__new__(cls, *args,
**kwargs)` (the user's `__new__` inlined); when `obj` is not an instance of `cls` it is returned
as is; else `type(obj).__init__(obj, *args, **kwargs)` runs (inlined) and must return None.
`object.__new__(cls, ...)` makes a new plain object (user_objects.NewObjectVariable) for a class
whose every base but `object` is a Python class without a native layout, with CPython's
excess-argument check (`object_new`). Anything else (native bases, metaclasses with their own
`__call__`, a `__new__` that is not Python code) is refused.
Does not own plain construction (user_objects.construct_instance, which calls in here when the
class has a Python `__new__`) or the objects themselves.
"""

from __future__ import annotations

import types
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.user_objects import (ClassVariable, NewObjectVariable, ObjState,
                                             class_attr_tracker, lookup_class_attr)

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def has_python_new(cls: type) -> bool:
    """`cls.__new__` is a user function (a `__new__` in a class body is a staticmethod) and
    `cls()` goes through `type.__call__`."""
    new = lookup_class_attr(cls, "__new__")
    return isinstance(new, staticmethod) and isinstance(new.__func__, types.FunctionType) and \
        type(cls).__call__ is type.__call__


def construct_with_new(tx, cls: type, args, kwargs, cls_source=None) -> VariableTracker:
    cls_var = ClassVariable(source=cls_source, value=cls)
    new = class_attr_tracker(tx, cls, cls_source, "__new__", lookup_class_attr(cls, "__new__"),
                             None)
    obj = tx.realize(tx.realize(new).call_function(tx, [cls_var, *args], kwargs))
    obj_type = obj.python_type()
    if not (isinstance(obj_type, type) and issubclass(obj_type, cls)):
        return obj  # CPython: __init__ runs only on an instance of cls
    init = lookup_class_attr(obj_type, "__init__")
    if init is object.__init__:
        return obj  # excess arguments are fine: __new__ is overridden
    if not isinstance(init, types.FunctionType):
        unsupported(f"{obj_type.__name__}.__init__ is not Python code",
                    BreakReason.UNSUPPORTED_CALL)
    src = cls_source if obj_type is cls else getattr(obj, "cls_source", None)
    ret = tx.realize(tx.realize(class_attr_tracker(tx, obj_type, src, "__init__", init, obj))
                     .call_function(tx, list(args), kwargs))
    if not (ret.is_python_constant() and ret.as_python_constant() is None):
        unsupported("TypeError: __init__() should return None", BreakReason.EXCEPTION)
    return obj


def _plain_layout(cls: Any) -> bool:
    """Instances of `cls` are plain objects with a `__dict__` (no native base but object)."""
    if not isinstance(cls, type) or cls is object:
        return False
    return all(k is object or (k.__flags__ & _HEAPTYPE and "__slots__" not in vars(k))
               for k in cls.__mro__)


def object_new(tx, cls, *args, **kwargs):
    cls_v = tx.realize(cls)
    if not cls_v.is_python_constant():
        unsupported(f"object.__new__({cls_v.describe()})", BreakReason.UNSUPPORTED_BUILTIN)
    klass = cls_v.as_python_constant()
    if not isinstance(klass, type):
        unsupported(f"TypeError: object.__new__(X): X is not a type object ({klass!r})",
                    BreakReason.EXCEPTION)
    if not _plain_layout(klass):
        unsupported(f"object.__new__({klass.__name__}): not a plain Python class",
                    BreakReason.UNSUPPORTED_CALL)
    if (args or kwargs) and (lookup_class_attr(klass, "__new__") is not object.__new__ or
                             lookup_class_attr(klass, "__init__") is object.__init__):
        unsupported(f"TypeError: {klass.__name__}() takes no arguments / object.__new__() "
                    "takes exactly one argument", BreakReason.EXCEPTION)
    return NewObjectVariable(cls=klass, state=ObjState({}), cls_source=cls_v.source)


HANDLERS = {object.__new__: object_new}

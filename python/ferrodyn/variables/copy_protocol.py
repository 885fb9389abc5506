"""`object.__reduce_ex__(obj, protocol)` and `object.__getstate__(obj)` for an instance of a
plain Python class: the step of `copy.copy`/`copy.deepcopy` (`copy.py`: `reductor =
getattr(cls, "__reduce_ex__"); rv = reductor(x, 4)`) that the rest of `copy._reconstruct` builds
on (transformers copies a config with `copy.copy(config)` to make a layer's view of it).

Owns those handlers, and one for `object.__reduce__` (copyreg's protocol-0 path) that refuses:
it lets the lookup `obj.__reduce__` that `__reduce_ex__` makes succeed. CPython's
`object.__reduce_ex__` (Objects/typeobject.c) with protocol >= 2 and a class that keeps object's `__reduce__` is `reduce_newobj`: no `__getnewargs_ex__` /
`__getnewargs__` gives `(copyreg.__newobj__, (cls,), state, None, None)`, where `state` is what
object's `__getstate__` gives: None for an empty instance `__dict__`, else the `__dict__` itself
(the same object: `_reconstruct` reads it through `y.__dict__.update(state)`), and for a class
without slots the checks on the layout pass. Modelled only there: a class whose every base but
`object` is a Python class without `__slots__` or a native layout (`dunder_new._plain_layout`)
that does not override `__reduce__`/`__getstate__`, defines no `__getnewargs[_ex]__`, and already
holds its `__slotnames__` cache (eager's first copy stores `cls.__slotnames__`, a mutation of
the class the trace does not make). The instance lookups CPython makes (`obj.__reduce__`,
`obj.__getnewargs_ex__`, `obj.__getnewargs__`, `obj.__getstate__`) go through the class's
`__getattribute__` when it overrides object's: traced (`has_attr`, for their reads and errors),
and each must find an attribute exactly where the class has one (an override that answers
these dunder names with objects of its own is outside this model). Anything else (a protocol < 2, another class, an instance attribute shadowing one of
those names) is refused.
Does not own `copy._reconstruct` (traced as Python code) or `object.__new__` (dunder_new.py).
"""

from __future__ import annotations

import copyreg

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.dunder_new import _plain_layout
from ferrodyn.variables.lists import TupleVariable
from ferrodyn.variables.user_objects import (_ABSENT, ClassVariable, NewObjectVariable,
                                             UserObjectVariable, lookup_class_attr,
                                             pending_class_attr)

_DEFAULTS = {"__reduce__": object.__reduce__, "__getstate__": getattr(object, "__getstate__", _ABSENT),
             "__getnewargs_ex__": _ABSENT, "__getnewargs__": _ABSENT}


def _refuse(what: str):
    unsupported(f"object.__reduce_ex__ on {what}", BreakReason.UNSUPPORTED_CALL)


def _default_state(tx, obj):
    """object's `__getstate__()` of a plain object: None for an empty `__dict__`, else the
    `__dict__` itself."""
    state = tx.realize(obj.var_getattr(tx, "__dict__"))
    return state if state.truth(tx) else ConstantVariable(value=None)


def object_getstate(tx, obj):
    obj = tx.realize(obj)
    if not isinstance(obj, (UserObjectVariable, NewObjectVariable)) or \
            not _plain_layout(obj.python_type()):
        unsupported(f"object.__getstate__ on {obj.describe()}", BreakReason.UNSUPPORTED_CALL)
    return _default_state(tx, obj)


def object_reduce(tx, obj, *args):
    """`object.__reduce__(obj)` is copyreg's protocol-0 path: refused (modelled as a callable
    so that looking it up on an instance, as `object.__reduce_ex__` does, is possible)."""
    unsupported("object.__reduce__ (copyreg._reduce_ex)", BreakReason.UNSUPPORTED_CALL)


def object_reduce_ex(tx, obj, protocol):
    obj = tx.realize(obj)
    proto = tx.realize(protocol)
    if not isinstance(obj, (UserObjectVariable, NewObjectVariable)):
        _refuse(obj.describe())
    if not proto.is_python_constant() or type(proto.as_python_constant()) is not int or \
            proto.as_python_constant() < 2:
        _refuse("a protocol below 2 or not a constant int (copyreg's path)")
    cls = obj.python_type()
    name = getattr(cls, "__name__", "?")
    if not _plain_layout(cls) or _DEFAULTS["__getstate__"] is _ABSENT:
        _refuse(f"a {name} object (not a plain Python class)")
    for attr, default in _DEFAULTS.items():
        if lookup_class_attr(cls, attr) is not default or \
                pending_class_attr(tx, cls, attr) is not None:
            _refuse(f"a {name} object ({attr} is not object's)")
    if vars(cls).get("__slotnames__", None) != []:
        _refuse(f"a {name} object (its class has no __slotnames__ cache yet)")
    for attr, default in _DEFAULTS.items():
        if obj.instance_attr(tx, attr) is not None:
            _refuse(f"a {name} object (an instance attribute {attr})")
        if obj.has_attr(tx, attr) != (default is not _ABSENT):
            _refuse(f"a {name} object (its __getattribute__ answers {attr})")
    state = _default_state(tx, obj)
    from ferrodyn.variables.builder import build_unsourced
    new = build_unsourced(copyreg.__newobj__)
    cls_var = ClassVariable(source=obj.type_source(), value=cls)
    none = ConstantVariable(value=None)
    return TupleVariable(items=(new, TupleVariable(items=(cls_var,)), state, none, none))


HANDLERS = {object.__reduce_ex__: object_reduce_ex, object.__reduce__: object_reduce}
if hasattr(object, "__getstate__"):  # 3.11+
    HANDLERS[object.__getstate__] = object_getstate

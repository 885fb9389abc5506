"""`isinstance(obj, cls)` where `cls`'s metaclass decides instead of the class hierarchy.

Owns the classes whose metaclass overrides `__instancecheck__`: legacy tensor types
(`torch.FloatTensor`: dtype and device of the tensor, read from the fake example, which
TENSOR_MATCH guards) and user metaclasses whose `__instancecheck__` is Python code (inlined, its
result converted with truth as CPython's `PyObject_IsInstance` does). A metaclass check in C that
is not one of those is refused. Classes with the default check, ABCs and `typing` aliases keep the
class-hierarchy answer of builtins.py (`issubclass(type(obj), cls)`). Does not own isinstance's
argument parsing or the hierarchy check (builtins.py).
"""

from __future__ import annotations

import abc
import types
from typing import Any

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, raised_while_tracing, unsupported

_HIERARCHY_CHECKS = (type.__instancecheck__, abc.ABCMeta.__instancecheck__,
                     type(torch.nn.Parameter).__instancecheck__)


def is_legacy_tensor_type(classinfo) -> bool:
    """Whether a class (or tuple of classes) holds a legacy tensor type (`torch.FloatTensor`)."""
    if isinstance(classinfo, tuple):
        return any(is_legacy_tensor_type(c) for c in classinfo)
    return type(classinfo) is type(torch.FloatTensor)


def _flatten(classinfo) -> list:
    if isinstance(classinfo, tuple):
        return [c for part in classinfo for c in _flatten(part)]
    return [classinfo]


def _hierarchy_decides(cls: Any) -> bool:
    meta = type(cls)
    return meta.__module__ == "typing" or getattr(meta, "__instancecheck__", None) in _HIERARCHY_CHECKS


def metaclass_isinstance(tx, obj: VariableTracker, classinfo) -> bool | None:
    """The answer of `isinstance(obj, classinfo)` when a class of `classinfo` has a metaclass
    check; None when the class hierarchy decides for every class."""
    classes = _flatten(classinfo)
    if all(_hierarchy_decides(c) for c in classes):
        return None
    from ferrodyn.variables.builder import build_unsourced
    from ferrodyn.variables.tensor import TensorVariable
    obj_type = obj.python_type()
    for cls in classes:
        if obj_type is cls:  # CPython answers an exact type match before any metaclass check
            return True
        if _hierarchy_decides(cls):
            try:
                hit = issubclass(obj_type, cls)
            except TypeError as e:
                raised_while_tracing(str(e))
        elif is_legacy_tensor_type(cls):
            hit = isinstance(obj.example, cls) if isinstance(obj, TensorVariable) else \
                issubclass(obj_type, cls)
        elif getattr(type(cls), "__instancecheck__", None) in _METACLASS_CHECKS:
            hit = _METACLASS_CHECKS[type(cls).__instancecheck__](tx, obj, cls)
        else:
            check = getattr(type(cls), "__instancecheck__", None)
            if not isinstance(check, types.FunctionType):
                unsupported(f"isinstance against {cls!r} (its metaclass's __instancecheck__ is not "
                            f"Python code)", BreakReason.UNSUPPORTED_CALL)
            result = tx.realize(build_unsourced(check)).call_function(
                tx, [build_unsourced(cls), obj], {})
            hit = tx.realize(result).truth(tx)
        if hit:
            return True
    return False


def _buffer_instancecheck(tx, obj: VariableTracker, cls: type) -> bool:
    """`isinstance(obj, torch.nn.Buffer)` (`_BufferMeta.__instancecheck__`): a tensor carrying an
    `_is_buffer` attribute (what `Buffer(t)` returns is a plain Tensor with the flag), else the
    class hierarchy. A tensor made by the graph carries no flag; the flag of a tensor from the
    frame is not guarded, so that case is refused."""
    from ferrodyn.variables.tensor import TensorVariable
    obj_type = obj.python_type()
    if cls is getattr(torch.nn, "Buffer", None) and isinstance(obj_type, type) and \
            issubclass(obj_type, torch.Tensor):
        if not isinstance(obj, TensorVariable) or obj.source is not None:
            unsupported(f"isinstance({obj.describe()}, nn.Buffer) of a tensor from the frame (its "
                        f"_is_buffer flag is not guarded)", BreakReason.UNSUPPORTED_CALL)
    return issubclass(obj_type, cls)


# metaclass `__instancecheck__`s written in Python whose answer is modelled rather than inlined
_METACLASS_CHECKS: dict = {}
if hasattr(torch.nn, "Buffer"):
    _METACLASS_CHECKS[type(torch.nn.Buffer).__instancecheck__] = _buffer_instancecheck

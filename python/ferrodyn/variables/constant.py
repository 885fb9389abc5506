"""Trackers for Python constants: None, bool, int, float, complex, str, bytes, Ellipsis, slice,
range, torch.Size, torch.dtype/device/layout, enum members, tuples of these, and the pure
methods of such values (`"{}".format(3)`, `(2, 3).index(3)`, `size.numel()`).

Owns the allow-list of constant types and the constant-folding of their methods. Does not own
operators between trackers (operators.py) or builtins (builtins.py).
"""

from __future__ import annotations

import enum
import inspect
import types
from dataclasses import dataclass
from typing import Any

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, raised_while_tracing, unsupported

# Types whose instances are immutable values: safe to fold and to embed as graph constants.
CONSTANT_TYPES: tuple[type, ...] = (
    type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented),
    slice, range, torch.Size, torch.dtype, torch.device, torch.layout, torch.memory_format,
    torch.finfo, torch.iinfo, types.CodeType, inspect.Parameter,
)


def is_constant_value(value: Any) -> bool:
    if isinstance(value, enum.Enum) or type(value) is torch.nn.attention.SDPBackend:
        return True
    if type(value) in (tuple, frozenset) or type(value) is torch.Size:
        return all(is_constant_value(v) for v in value)
    if type(value) is slice:
        return all(is_constant_value(v) for v in (value.start, value.stop, value.step))
    return isinstance(value, CONSTANT_TYPES) and (type(value) in CONSTANT_TYPES)


def fold(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a pure Python function on constants; a raised exception is raised in the traced code
    when it is modelled exactly (variables/exceptions.py), else gives up (eager raises it)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        from ferrodyn.variables.exceptions import raise_real
        raise_real(e, str(getattr(fn, '__name__', fn)))


@dataclass(frozen=True, eq=False)
class ConstantVariable(VariableTracker):
    value: Any = None

    def python_type(self) -> type:
        return type(self.value)

    def as_python_constant(self) -> Any:
        return self.value

    def identity(self) -> Any:
        return ("const", id(self.value)) if not isinstance(self.value, (int, float, str)) else \
            ("const", type(self.value), self.value)

    def describe(self) -> str:
        return f"constant {self.value!r}"

    def var_getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raised_while_tracing(f"{e}")
        if callable(attr) and not isinstance(attr, type):
            return ConstantMethodVariable(obj=self.value, name=name)
        if is_constant_value(attr):
            return ConstantVariable(value=attr)
        unsupported(f"attribute {name!r} of {self.describe()}", BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        return hasattr(self.value, name)

    def unpack(self, tx):
        try:
            items = list(self.value)
        except TypeError as e:
            raised_while_tracing(str(e))
        return [ConstantVariable(value=v) for v in items]

    def truth(self, tx):
        return bool(self.value)

    def length(self, tx):
        return fold(len, self.value)

    def getitem(self, tx, index):
        if not index.is_python_constant():
            unsupported(f"indexing {self.describe()} with {index.describe()}",
                        BreakReason.DATA_DEPENDENT)
        return wrap_constant(fold(lambda: self.value[index.as_python_constant()]))

    def contains(self, tx, item):
        if not item.is_python_constant():
            return super().contains(tx, item)
        return fold(lambda: item.as_python_constant() in self.value)

    def fx_arg(self, tx):
        return self.value, self.value

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        return OutConst(self.value)


def wrap_constant(value: Any) -> VariableTracker:
    if not is_constant_value(value):
        if type(value) in (list, tuple) and all(is_constant_value(v) for v in value):
            from ferrodyn.variables.lists import ListVariable, TupleVariable
            items = [ConstantVariable(value=v) for v in value]
            return TupleVariable(items=tuple(items)) if type(value) is tuple \
                else ListVariable.new(items)
        unsupported(f"value of type {type(value).__name__}", BreakReason.UNSUPPORTED_TYPE)
    return ConstantVariable(value=value)


def _with_items_built(tx, v: VariableTracker) -> VariableTracker:
    """`v` realized, a list or tuple tracker with its items built (a frame's tuple holds its
    items unbuilt until used, so it is not a python constant before: building guards each)."""
    from ferrodyn.variables.lists import ListVariable, TupleVariable
    v = tx.realize(v)
    if isinstance(v, TupleVariable):
        return TupleVariable(items=tuple(_with_items_built(tx, i) for i in v.unpack(tx)))
    if isinstance(v, ListVariable):
        return ListVariable.new(_with_items_built(tx, i) for i in v.unpack(tx))
    return v


# Methods of constant values that mutate or do I/O: none of the constant types have any, but
# `str.format` with non-constant arguments must not fold.
@dataclass(frozen=True, eq=False)
class ConstantMethodVariable(VariableTracker):
    """`value.name` for a constant value; folded when called with constant arguments."""

    obj: Any = None
    name: str = ""

    def describe(self) -> str:
        return f"method {type(self.obj).__name__}.{self.name}"

    def call_function(self, tx, args, kwargs):
        if type(self.obj) is str:  # `"{}".format(self.size)`: a str method only reads them
            args = [_with_items_built(tx, a) for a in args]
            kwargs = {k: _with_items_built(tx, v) for k, v in kwargs.items()}
        if not all(a.is_python_constant() for a in [*args, *kwargs.values()]):
            unsupported(f"{self.describe()} with non-constant arguments",
                        BreakReason.UNSUPPORTED_CALL)
        if self.name == "__iter__" and not args and not kwargs:  # range(3).__iter__()
            return ConstantVariable(value=self.obj).iterator(tx)
        method = getattr(self.obj, self.name)
        return wrap_constant(fold(method, *[a.as_python_constant() for a in args],
                                  **{k: v.as_python_constant() for k, v in kwargs.items()}))

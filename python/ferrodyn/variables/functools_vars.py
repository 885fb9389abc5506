"""Trackers for the callables of `operator` that hold arguments: `itemgetter`, `attrgetter`,
`methodcaller`, made in the frame or read from it (guarded by identity; their arguments are
constants fixed at creation).

Owns `OperatorGetterVariable` and the handlers that make one. Does not own `functools.partial`
(functions.py) or the plain `operator` functions (builtins.py).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable, is_constant_value


def _get_attr_path(tx, obj: VariableTracker, path: str) -> VariableTracker:
    for part in path.split("."):
        obj = tx.realize(tx.realize(obj).var_getattr(tx, part))
    return obj


def _call_itemgetter(tx, g, args):
    from ferrodyn.variables.lists import TupleVariable
    (obj,) = args
    items = [tx.realize(obj).getitem(tx, ConstantVariable(value=k)) for k in g.args]
    return items[0] if len(items) == 1 else TupleVariable(items=tuple(items))


def _call_attrgetter(tx, g, args):
    from ferrodyn.variables.lists import TupleVariable
    (obj,) = args
    items = [_get_attr_path(tx, obj, name) for name in g.args]
    return items[0] if len(items) == 1 else TupleVariable(items=tuple(items))


def _call_methodcaller(tx, g, args):
    (obj,) = args
    name, *rest = g.args
    return tx.realize(obj).call_method(tx, name, [ConstantVariable(value=v) for v in rest],
                                       {k: ConstantVariable(value=v)
                                        for k, v in g.kwargs.items()})


_CALLS = {operator.itemgetter: _call_itemgetter, operator.attrgetter: _call_attrgetter,
          operator.methodcaller: _call_methodcaller}


@dataclass(frozen=True, eq=False)
class OperatorGetterVariable(VariableTracker):
    """`operator.itemgetter(*keys)`, `attrgetter(*names)`, `methodcaller(name, *args)` with
    constant arguments. `value` is the real object when it came from the frame."""

    kind: Any = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    value: Any = None

    def python_type(self):
        return self.kind

    def identity(self):
        return ("obj", id(self.value)) if self.value is not None else self

    def describe(self):
        return f"operator.{self.kind.__name__}{self.args!r}"

    def call_function(self, tx, args, kwargs):
        if kwargs or len(args) != 1:
            unsupported(f"TypeError: {self.describe()} takes one argument", BreakReason.EXCEPTION)
        return _CALLS[self.kind](tx, self, list(args))

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        if self.source is not None:
            return super().reconstruct(tx)
        return OutConst(self.kind(*self.args, **self.kwargs))


def _maker(kind):
    def handler(tx, *args, **kwargs):
        vals = [tx.realize(a) for a in [*args, *kwargs.values()]]
        if not all(v.is_python_constant() and is_constant_value(v.as_python_constant())
                   for v in vals):
            unsupported(f"operator.{kind.__name__} with non-constant arguments",
                        BreakReason.UNSUPPORTED_CALL)
        consts = [v.as_python_constant() for v in vals]
        return OperatorGetterVariable(kind=kind, args=tuple(consts[:len(args)]),
                                      kwargs=dict(zip(kwargs, consts[len(args):])))
    return handler


HANDLERS = {kind: _maker(kind) for kind in _CALLS}


def from_frame_value(value: Any, source) -> OperatorGetterVariable | None:
    """The tracker of an itemgetter/attrgetter read from the frame (the caller guards it by
    identity), when its arguments are constants."""
    kind = type(value)
    if kind is operator.methodcaller:
        return None  # its arguments are not introspectable without running __reduce__'s partial
    args = value.__reduce__()[1]
    if not is_constant_value(args):
        return None
    return OperatorGetterVariable(source=source, kind=kind, args=tuple(args), value=value)

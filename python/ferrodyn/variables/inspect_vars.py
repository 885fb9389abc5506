"""`inspect.signature` of functions the trace knows (library code asks how many parameters a
callback takes: transformers' `apply_chunking_to_forward`, decorators that map arguments).

Owns `SignatureVariable` (a real `inspect.Signature`, immutable, computed from a function that
is guarded by identity) and the handler of `inspect.signature`. Parameters are constants
(`inspect.Parameter` is immutable); `parameters` is a read-only mapping. Does not own function
attributes (functions.py).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.side_effects import MutationType
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable


def _function_signature(tx, fn: VariableTracker) -> inspect.Signature:
    from ferrodyn.variables.functions import BoundMethodVariable, UserFunctionVariable
    fn = tx.realize(fn)
    if isinstance(fn, UserFunctionVariable) and not fn.by_code:  # (a closure: unguarded)
        return inspect.signature(fn.fn)
    if isinstance(fn, BoundMethodVariable):
        func = tx.realize(fn.func)
        if isinstance(func, UserFunctionVariable) and not func.by_code and \
                isinstance(inspect.getattr_static(func.fn, "__signature__", None), type(None)):
            sig = inspect.signature(func.fn)
            params = list(sig.parameters.values())
            if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                    inspect.Parameter.POSITIONAL_OR_KEYWORD):
                unsupported("signature of a method without a self parameter",
                            BreakReason.UNSUPPORTED_CALL)
            return sig.replace(parameters=params[1:])
    unsupported(f"inspect.signature of {fn.describe()}", BreakReason.UNSUPPORTED_CALL)


@dataclass(frozen=True, eq=False)
class SignatureVariable(VariableTracker):
    value: inspect.Signature = None  # type: ignore[assignment]

    def python_type(self):
        return inspect.Signature

    def describe(self):
        return f"signature {self.value}"

    def var_getattr(self, tx, name):
        from ferrodyn.variables.dicts import DictState, DictVariable
        if name == "parameters":
            items = {k: ConstantVariable(value=p) for k, p in self.value.parameters.items()}
            return DictVariable(state=DictState(items, MutationType.EXISTING, read_only=True,
                                                cls=types.MappingProxyType))
        unsupported(f"Signature.{name}", BreakReason.UNSUPPORTED_TYPE)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        return OutConst(self.value)


def _signature(tx, fn, *rest, **kwargs):
    if rest or kwargs:
        unsupported("inspect.signature with options", BreakReason.UNSUPPORTED_CALL)
    try:
        return SignatureVariable(value=_function_signature(tx, fn))
    except (TypeError, ValueError) as e:
        unsupported(f"inspect.signature raised {type(e).__name__}: {e}", BreakReason.EXCEPTION)


HANDLERS: dict[Any, Any] = {inspect.signature: _signature}

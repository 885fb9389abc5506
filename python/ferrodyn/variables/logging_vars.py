"""`logging.Logger` objects read from the frame: their output calls (`debug`, `info`,
`warning`, `error`, `critical`, `log`, and methods libraries attach to Logger such as
transformers' `warning_once`) are recorded and replayed by the entry after the graph, in
program order (TraceResult.side_effects), never dropped; everything else about a logger gives
up (its level and handlers are not modelled).

Owns `LoggerVariable` and its builder entry. Does not own `warnings.warn` (builtins.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable

# Logger methods that only emit records (or dedup and emit): replayed, returning None.
_EMITTERS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "fatal", "log",
                       "warning_once", "info_once", "warning_advice"})


@dataclass(frozen=True, eq=False)
class LoggerVariable(VariableTracker):
    value: logging.Logger = None  # type: ignore[assignment]

    def python_type(self):
        return type(self.value)

    def identity(self):
        return ("obj", id(self.value))

    def describe(self):
        return f"logger {self.value.name!r}"

    def var_getattr(self, tx, name):
        if name in _EMITTERS and callable(getattr(self.value, name, None)):
            return _LoggerCall(logger=self, name=name)
        unsupported(f"attribute {name!r} of {self.describe()}", BreakReason.UNSUPPORTED_TYPE)

    def call_method(self, tx, name, args, kwargs):
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)


@dataclass(frozen=True, eq=False)
class _LoggerCall(VariableTracker):
    logger: LoggerVariable = None  # type: ignore[assignment]
    name: str = ""

    def call_function(self, tx, args, kwargs):
        method = getattr(self.logger.value, self.name)
        tx.output.side_effects.record_call(method, (*args, *kwargs.values()), tuple(kwargs))
        return ConstantVariable(value=None)


def build_logger(tx, value: Any, source) -> VariableTracker:
    from ferrodyn.guard_spec import GuardKind
    tx.output.install_guard(source, GuardKind.ID_MATCH, value)
    return LoggerVariable(source=source, value=value)

"""`torch.autograd.profiler.record_function(name)` inside traced code: a context manager with
no effect on values, ignored as TorchDynamo ignores it (the profiler does not see the region;
values, graphs and guards are unchanged). Owns that tracker. Does not own grad/autocast
contexts (ctx_managers.py) or the `with` protocol (opcodes_control.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable


@dataclass(frozen=True, eq=False)
class IgnoredProfilerContextVariable(VariableTracker):
    def describe(self):
        return "profiler record_function context (ignored)"

    def var_getattr(self, tx, name):
        if name in ("__enter__", "__exit__"):
            from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        return super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            return self
        if name == "__exit__":
            return ConstantVariable(value=False)
        unsupported(f"{self.describe()}.{name}", BreakReason.UNSUPPORTED_CALL)


def _record_function(tx, args, kwargs):
    return IgnoredProfilerContextVariable()


PROFILER_HANDLERS = {torch.autograd.profiler.record_function: _record_function}

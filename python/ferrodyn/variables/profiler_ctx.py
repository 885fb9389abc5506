"""`torch.autograd.profiler.record_function(name)` inside traced code: a context manager with
no effect on values, ignored as TorchDynamo ignores it (the profiler does not see the region;
values, graphs and guards are unchanged). At a graph break inside its `with` block the entry
runs the breaking instruction in a real one and the resume function ignores a new one.
Owns that tracker. Does not own grad/autocast contexts (ctx_managers.py) or the `with`
protocol (opcodes_control.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.ctx_managers import CtxMethodsMixin


@dataclass(frozen=True, eq=False)
class IgnoredProfilerContextVariable(CtxMethodsMixin, VariableTracker):
    args: tuple | None = None  # the constant arguments it was made with (None: not constant)

    def exit_at_break(self, tx) -> None:
        """A graph break inside its `with` block: nothing to leave (it was never entered)."""

    def reenter(self):
        """What stands for its live `__exit__` across a break: the entry runs the breaking
        instruction inside a real `record_function` (the profiler sees it, as in eager), the
        resume function makes an ignored one again."""
        if self.args is None:
            return None
        from ferrodyn.resume.capture import AutocastReenter
        return AutocastReenter(self.args, make=torch.autograd.profiler.record_function)

    def describe(self):
        return "profiler record_function context (ignored)"

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            return self
        if name == "__exit__":
            return ConstantVariable(value=False)
        unsupported(f"{self.describe()}.{name}", BreakReason.UNSUPPORTED_CALL)


def _record_function(tx, args, kwargs):
    vals = [tx.realize(a) for a in args]
    if kwargs or not all(v.is_python_constant() for v in vals):
        return IgnoredProfilerContextVariable()
    return IgnoredProfilerContextVariable(args=tuple(v.as_python_constant() for v in vals))


PROFILER_HANDLERS = {torch.autograd.profiler.record_function: _record_function}

"""`contextlib.contextmanager` context managers: the generator function's body is inlined in
two halves, up to its `yield` on `__enter__` and from it to its end on `__exit__`, in a
`generators.GeneratorFrame` that is suspended in between (its stack and locals kept).

Owns `GeneratorContextManagerVariable` (what `_GeneratorContextManager(func, args, kwds)`
makes) and its handler. The exceptional exit (an exception inside the `with` body) stays
refused by WITH_EXCEPT_START; a generator that yields twice or not at all gives up as CPython
raises RuntimeError. Does not own `with` (symbolic/opcodes_control.py) or user classes with
`__enter__`/`__exit__` (user_objects.py, inlined as methods).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable


@dataclass
class GenState:
    frame: Any = None       # the generator's body (generators.GeneratorFrame), suspended
    stage: str = "new"      # new -> entered -> exited


@dataclass(frozen=True, eq=False)
class GeneratorContextManagerVariable(VariableTracker):
    func: VariableTracker = None  # type: ignore[assignment]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    state: GenState = field(default_factory=GenState)

    def python_type(self):
        return contextlib._GeneratorContextManager

    def identity(self):
        return self.state

    def describe(self):
        return "contextmanager context"

    def var_getattr(self, tx, name):
        if name in ("__enter__", "__exit__"):
            return _CMMethod(cm=self, name=name)
        unsupported(f"attribute {name!r} of a contextmanager context", BreakReason.UNSUPPORTED_TYPE)

    def call_method(self, tx, name, args, kwargs):
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def enter(self, tx) -> VariableTracker:
        from ferrodyn.variables.functions import InlinableFunction, bind_args
        from ferrodyn.variables.generators import GeneratorFrame
        st = self.state
        if st.stage != "new":
            unsupported("a contextmanager context entered twice", BreakReason.EXCEPTION)
        fn = tx.realize(self.func)
        if not isinstance(fn, InlinableFunction):
            unsupported(f"contextmanager over {fn.describe()}", BreakReason.UNSUPPORTED_CALL)
        code = fn.code()
        bound = bind_args(code, fn.name(), list(self.args), dict(self.kwargs),
                          fn.defaults(tx), fn.kwdefaults(tx))
        st.frame, st.stage = GeneratorFrame(tx, fn, bound), "entered"
        st.frame.check_closed_at_end(tx)  # entered and never exited: its finally is pending
        value = st.frame.resume(tx)
        if value is None:
            unsupported("RuntimeError: generator didn't yield", BreakReason.EXCEPTION)
        return value

    def exit(self, tx, args) -> VariableTracker:
        st = self.state
        if st.stage != "entered":
            unsupported("a contextmanager context exited before it was entered",
                        BreakReason.EXCEPTION)
        if any(not (tx.realize(a).is_python_constant() and
                    tx.realize(a).as_python_constant() is None) for a in args):
            unsupported("contextmanager exit with an exception", BreakReason.EXCEPTION)
        st.stage = "exited"
        if st.frame.resume(tx) is not None:
            unsupported("RuntimeError: generator didn't stop", BreakReason.EXCEPTION)
        return ConstantVariable(value=False)


@dataclass(frozen=True, eq=False)
class _CMMethod(VariableTracker):
    cm: GeneratorContextManagerVariable = None  # type: ignore[assignment]
    name: str = ""

    def call_function(self, tx, args, kwargs):
        if self.name == "__enter__":
            return self.cm.enter(tx)
        return self.cm.exit(tx, list(args))


def _make(tx, func, args, kwds):
    from ferrodyn.variables.dicts import DictVariable
    args, kwds = tx.realize(args), tx.realize(kwds)
    if not isinstance(kwds, DictVariable):
        unsupported("contextmanager keyword arguments", BreakReason.UNSUPPORTED_CALL)
    return GeneratorContextManagerVariable(func=func, args=tuple(args.unpack(tx)),
                                           kwargs=dict(kwds.state.items))


HANDLERS = {contextlib._GeneratorContextManager: _make}

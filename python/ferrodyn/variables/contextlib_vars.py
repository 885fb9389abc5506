"""`contextlib.contextmanager` context managers: the generator function's body is inlined in
two halves, up to its `yield` on `__enter__` and from it to its end on `__exit__`, in a
`generators.GeneratorFrame` that is suspended in between (its stack and locals kept). An
exception reaching `__exit__` (from the `with` body through symbolic/opcodes_with.py, or passed
explicitly) is thrown into the body at its `yield`, as CPython's contextlib does (see `exit`);
a generator that yields twice or not at all raises RuntimeError as CPython's does.

Owns `GeneratorContextManagerVariable` (what `_GeneratorContextManager(func, args, kwds)`
makes) and its handler, and `ExitStackVariable` (`contextlib.ExitStack`, see its docstring).
Does not own `with` (symbolic/opcodes_control.py) or user classes with `__enter__`/`__exit__`
(user_objects.py, inlined as methods).
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
        if value is None:  # `raise RuntimeError("generator didn't yield") from None`, raised
            # while handling the StopIteration `next()` raised (its __context__)
            from ferrodyn.variables.exceptions import (
                ExceptionVariable, TracedException, set_context)
            stop = ExceptionVariable(cls=StopIteration)
            set_context(tx, stop)
            err = _runtime_error(tx, "generator didn't yield")
            err.set_chain("__context__", stop)
            err.set_chain("__cause__", None)
            err.set_chain("__suppress_context__", True)
            raise TracedException(err, chain=False)
        return value

    def exit(self, tx, args) -> VariableTracker:
        """`_GeneratorContextManager.__exit__(typ, value, traceback)` as CPython's contextlib
        runs it (the same code in 3.11-3.13): without an exception the body runs on to its end
        (a second `yield`: RuntimeError, the generator closed); with one, it is thrown into the
        body at its `yield`, and what comes out decides: the body ending swallows it (True);
        the same exception coming back, or a RuntimeError wrapping a thrown StopIteration
        (PEP 479), propagates (False); any other exception replaces it; a `yield` in the
        handler is RuntimeError("generator didn't stop after throw()")."""
        from ferrodyn.variables.exceptions import ExceptionVariable, TracedException
        st = self.state
        if st.stage != "entered":
            unsupported("a contextmanager context exited before it was entered",
                        BreakReason.EXCEPTION)
        if len(args) != 3:
            unsupported(f"contextmanager __exit__ with {len(args)} arguments",
                        BreakReason.EXCEPTION)
        typ, value = tx.realize(args[0]), tx.realize(args[1])
        st.stage = "exited"
        if _is_none(typ):
            if st.frame.resume(tx) is not None:
                self._raise_and_close(tx, "generator didn't stop")
            return ConstantVariable(value=False)
        if _is_none(value):  # `value = typ()`: made so that the one coming back is recognised
            from ferrodyn.symbolic.exceptions import exception_of
            value = exception_of(tx, typ)
        if not isinstance(value, ExceptionVariable):
            unsupported(f"contextmanager exit with {value.describe()}", BreakReason.EXCEPTION)
        cls = typ.as_python_constant() if typ.is_python_constant() else None
        if not (isinstance(cls, type) and issubclass(value.cls, cls)):
            # 3.11's throw(typ, value) would wrap a value of another class in typ(value)
            unsupported(f"contextmanager exit with {typ.describe()} and {value.describe()}",
                        BreakReason.EXCEPTION)
        if st.frame.status != "suspended":
            unsupported("contextmanager exit with an exception into a generator that is not "
                        "suspended at its yield", BreakReason.EXCEPTION)
        try:
            item = st.frame.resume(tx, throw=value)
        except TracedException as e:
            exc = e.exc
            if exc is value:
                return ConstantVariable(value=False)
            if issubclass(exc.cls, StopIteration):  # (a StopIteration cannot leave the body)
                return ConstantVariable(value=True)
            if issubclass(exc.cls, RuntimeError) and issubclass(value.cls, StopIteration) \
                    and exc.get_chain("__cause__") is value:
                return ConstantVariable(value=False)
            raise TracedException(exc, chain=False) from None  # `raise`: as it came
        if item is None:  # the body ended: throw() raised its StopIteration (a new one)
            return ConstantVariable(value=True)
        self._raise_and_close(tx, "generator didn't stop after throw()")

    def _raise_and_close(self, tx, msg):
        """`try: raise RuntimeError(msg) finally: self.gen.close()`: close() runs while the
        RuntimeError is being handled; an exception from close() replaces it."""
        from ferrodyn.variables.exceptions import TracedException, set_context
        err = _runtime_error(tx, msg)
        set_context(tx, err)
        tx.exc_stack.append(err)
        try:
            self.state.frame.close(tx)
        finally:
            tx.exc_stack.pop()
        raise TracedException(err, chain=False)


def _is_none(v) -> bool:
    return v.is_python_constant() and v.as_python_constant() is None


def _runtime_error(tx, msg):
    from ferrodyn.variables.exceptions import make
    return make(tx, RuntimeError, (ConstantVariable(value=msg),), {})


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


# ---- contextlib.ExitStack ---------------------------------------------------------------------

@dataclass
class ExitStackState:
    # pushed exits, innermost last: ("exit", callable taking (exc_type, exc, tb)) or
    # ("callback", fn, args, kwargs)
    exits: list = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class ExitStackVariable(VariableTracker):
    """`contextlib.ExitStack()` made in the frame: `enter_context` enters any traced context
    manager (grad mode, autocast, `contextmanager` generators, user classes with
    `__enter__`/`__exit__`) and keeps its `__exit__`; `callback`, `push` (an exit callable or a
    context manager's `__exit__`), `pop_all`, `close` and the stack's own `__enter__`/`__exit__`.
    Exits run innermost first, as CPython's `ExitStack.__exit__` runs them, with the exception
    that reached the stack's `__exit__` (an exit returning true suppresses it). An exception
    raised by a context manager's `__enter__` or by an exit callback (CPython then runs the
    remaining exits with it and re-chains it) is refused; so is the stack escaping the frame (returned, stored),
    since its pending exits would have to live on."""

    state: ExitStackState = field(default_factory=ExitStackState)

    def python_type(self):
        return contextlib.ExitStack

    def identity(self):
        return self.state

    def describe(self):
        return "contextlib.ExitStack"

    def var_getattr(self, tx, name):
        if name in _EXIT_STACK_METHODS:
            return _StackMethod(stack=self, name=name)
        unsupported(f"attribute {name!r} of an ExitStack", BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        return hasattr(contextlib.ExitStack, name)

    def call_method(self, tx, name, args, kwargs):
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def unwind(self, tx, exc_details=None) -> bool:
        """Run the pushed exits, innermost first, as CPython's `ExitStack.__exit__` runs them:
        each `__exit__` gets the pending exception (`exc_details`; None: none), and one that
        returns true suppresses it (the exits after it get None). Returns whether an exception
        was suppressed. An exit callback that raises is refused (CPython re-chains it)."""
        none = ConstantVariable(value=None)
        from ferrodyn.variables.exceptions import TracedException
        details = list(exc_details) if exc_details is not None else [none, none, none]
        suppressed = False
        while self.state.exits:
            entry = self.state.exits.pop()
            try:
                if entry[0] == "exit":
                    result = tx.realize(entry[1]).call_function(tx, list(details), {})
                    if tx.realize(result).truth(tx):
                        suppressed = True
                        details = [none, none, none]
                else:
                    _, fn, args, kwargs = entry
                    tx.realize(fn).call_function(tx, list(args), dict(kwargs))
            except TracedException as e:
                unsupported(f"an ExitStack exit callback raised ({e})", BreakReason.EXCEPTION)
        return suppressed


def _enter_context(tx, stack, cm):
    from ferrodyn.variables.exceptions import TracedException
    cm = tx.realize(cm)
    exit_fn = cm.var_getattr(tx, "__exit__")  # looked up before entering, as CPython does
    try:
        result = cm.call_method(tx, "__enter__", [], {})
    except TracedException as e:
        unsupported(f"a context manager's __enter__ raised inside ExitStack.enter_context ({e})",
                    BreakReason.EXCEPTION)
    stack.state.exits.append(("exit", exit_fn))
    return result


def _callback(tx, stack, fn, *args, **kwargs):
    stack.state.exits.append(("callback", fn, tuple(args), dict(kwargs)))
    return fn


def _push(tx, stack, exit_):
    exit_ = tx.realize(exit_)
    try:
        has_exit = exit_.has_attr(tx, "__exit__")
    except Exception:  # noqa: BLE001  (a tracker that cannot answer: refuse, below)
        has_exit = None
    if has_exit is None:
        unsupported(f"ExitStack.push of {exit_.describe()}", BreakReason.UNSUPPORTED_CALL)
    stack.state.exits.append(("exit", exit_.var_getattr(tx, "__exit__") if has_exit else exit_))
    return exit_


def _pop_all(tx, stack):
    new = ExitStackVariable(state=ExitStackState(list(stack.state.exits)))
    stack.state.exits.clear()
    return new


def _close(tx, stack):
    stack.unwind(tx)
    return ConstantVariable(value=None)


def _stack_enter(tx, stack):
    return stack


def _stack_exit(tx, stack, *exc):
    if len(exc) != 3:
        unsupported(f"TypeError: ExitStack.__exit__ with {len(exc)} arguments",
                    BreakReason.EXCEPTION)
    exc = [tx.realize(a) for a in exc]
    received = not (exc[0].is_python_constant() and exc[0].as_python_constant() is None)
    suppressed = stack.unwind(tx, exc if received else None)
    return ConstantVariable(value=received and suppressed)


_EXIT_STACK_METHODS = {
    "__enter__": _stack_enter, "__exit__": _stack_exit, "enter_context": _enter_context,
    "callback": _callback, "push": _push, "pop_all": _pop_all, "close": _close,
}


@dataclass(frozen=True, eq=False)
class _StackMethod(VariableTracker):
    stack: ExitStackVariable = None  # type: ignore[assignment]
    name: str = ""

    def describe(self):
        return f"ExitStack.{self.name}"

    def call_function(self, tx, args, kwargs):
        try:
            return _EXIT_STACK_METHODS[self.name](tx, self.stack, *args, **kwargs)
        except TypeError as e:  # wrong arity: eager raises TypeError
            unsupported(f"ExitStack.{self.name}: {e}", BreakReason.EXCEPTION)


def _make_exit_stack(tx, *args, **kwargs):
    if args or kwargs:
        unsupported("TypeError: ExitStack() takes no arguments", BreakReason.EXCEPTION)
    return ExitStackVariable(state=ExitStackState())


HANDLERS[contextlib.ExitStack] = _make_exit_stack

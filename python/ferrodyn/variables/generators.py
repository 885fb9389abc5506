"""User-defined generators: a generator function's body runs in a suspended inlining translator,
resumed lazily, one step per `next()`, so it interleaves with its consumer exactly as CPython
interleaves them (graph ops, mutations and recorded calls come out in program order).

Owns:
- `GeneratorFrame`: the body of one generator (its translator, kept with its stack and locals
  between resumptions) and `resume(tx)`, which runs it to its next `yield` (the value) or to its
  end (None; the return value is kept for `yield from`). `contextlib_vars.py` drives a
  `contextmanager` body through the same frame.
- `GeneratorVariable`: what calling a generator function (plain function, method, an `__iter__`
  written as a generator, a generator expression) returns. It is an iterator tracker, so every
  consumer of iterators (`for`, unpacking, `list`/`tuple`/`dict`/`sum`/`zip`/`enumerate`/`map`,
  `next`, `in`, `yield from`) drives it lazily; `send(value)`, `throw(exc)` and `close()` too:
  throw/close raise the exception at the suspended `yield` (chained as CPython chains it) and
  the body's own handlers run; close() inside `yield from` closes the sub-generator first; a
  return from the handler is close()'s result on 3.13+. A StopIteration leaving the body
  becomes RuntimeError (PEP 479, cause and context set), as in CPython; `next()` of an
  exhausted generator raises StopIteration in the traced code (with the return value once).
- The refusals (never a wrong value): frame attributes (`gi_frame`...); `throw()` into a
  generator not suspended at a yield or suspended in `yield from`; a body that yields again in
  close(); a generator escaping the frame (returned, stored outside it, live across a graph
  break: it has no reconstruction); a generator left suspended at the end of the trace where
  GeneratorExit would run code of its body (a `finally`, a `with`, an `except` catching it:
  CPython runs it when the generator is collected, a moment this does not model); more than
  `MAX_YIELDS` resumptions (an infinite generator drained by its consumer).
A graph break inside a generator's body never resumes inside it (its translator takes no
`stop_at`): the break moves out to the root frame's instruction, if that one can resume.
Does not own the opcodes (symbolic/opcodes_control.py: RETURN_GENERATOR, YIELD_VALUE, SEND,
GET_YIELD_FROM_ITER, END_SEND) or when a call makes a generator (symbolic/inline.py).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Callable

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, instance_has_attr, unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.lists import IteratorVariable, IterState

#: Resumptions of one generator before the trace gives up (an infinite generator drained by
#: `list()` or unpacking would otherwise trace forever).
MAX_YIELDS = 4096


class GeneratorFrame:
    """The body of one generator, in a translator that is suspended at each `yield`."""

    def __init__(self, tx, fn, bound: dict[str, VariableTracker]):
        from ferrodyn.symbolic.translator import InstructionTranslator
        code = fn.code()
        closure = fn.closure(tx)
        if len(closure) != len(code.co_freevars):
            unsupported(f"closure of {code.co_name} does not match its code", BreakReason.OTHER)
        self.code = code
        self.translator = InstructionTranslator(
            code, fn.fn_globals(), tx.output, dict(bound), dict(zip(code.co_freevars, closure)),
            fn.globals_source(tx), parent=tx)
        # a break inside the body resumes at the root frame's instruction, never in the body
        self.translator.stop_at = None
        self.translator.generator = self
        self.status = "created"   # created -> suspended <-> running -> done
        self.yields = 0
        self.return_value: VariableTracker = ConstantVariable(value=None)
        self.in_handler = False   # suspended where close() would run code of the body

    @property
    def name(self) -> str:
        return self.code.co_qualname

    def resume(self, tx, sent: VariableTracker | None = None,
               throw: VariableTracker | None = None,
               closing: bool = False) -> VariableTracker | None:
        """Run the body from where it stopped to its next `yield` (returns the value) or its
        end (returns None; the return value is `return_value`). `tx` is the consumer; `sent`
        is what the `yield` evaluates to (`send(value)`; None for `next()`); `throw` an
        exception raised at the `yield` instead (`throw()`, `close()`: `closing`, which also
        reaches a `yield` inside `yield from`, whose sub-generator `close` closed first)."""
        from ferrodyn.symbolic.translator import _RETURNED_NOTHING
        from ferrodyn.variables.exceptions import TracedException
        sent = ConstantVariable(value=None) if sent is None else tx.realize(sent)
        if self.status == "done":
            return None
        if self.status == "running":
            _raise(tx, ValueError, "generator already executing")
        if self.status == "created" and not _is_none(sent):
            _raise(tx, TypeError, "can't send non-None value to a just-started generator")
        if throw is not None and self.status != "suspended":
            unsupported(f"throw() into generator {self.name} that is not suspended at a yield",
                        BreakReason.GENERATOR)
        self.yields += 1
        if self.yields > MAX_YIELDS:
            unsupported(f"generator {self.name} resumed more than {MAX_YIELDS} times "
                        f"(infinite generator?)", BreakReason.GENERATOR)
        child = self.translator
        if throw is not None and self.delegating() and not closing:
            unsupported(f"throw() into generator {self.name} suspended in `yield from`",
                        BreakReason.GENERATOR)
        if self.status == "suspended" and throw is None:
            child.stack.append(sent)  # what `yield` evaluates to
        child.parent = tx
        child.returned = _RETURNED_NOTHING
        child.yielded = None
        self.status = "running"
        try:
            if throw is not None:  # raised at the `yield`: the body's handler, or out of it
                from ferrodyn.symbolic.exceptions import unwind
                from ferrodyn.variables.exceptions import chain_to
                # CPython chains it to the exception the body itself is handling, if any
                # (not to the consumer's: _PyErr_ChainStackItem on the generator's exc_state)
                chain_to(child.exc_stack[-1] if child.exc_stack else None, throw)
                child.current = child.instructions[child.ip - 1]
                unwind(child, TracedException(throw, chain=False))
            child.run()
        except TracedException as e:
            self.status = "done"
            if issubclass(e.exc.cls, StopIteration):  # 3.11 (3.12+: stopiteration_error)
                raise TracedException(_stopiteration_runtime_error(tx, e.exc),
                                      chain=False) from None
            raise
        except BaseException:
            self.status = "done"
            raise
        if child.yielded is None:
            self.status = "done"
            self.in_handler = False
            self.return_value = child.returned
            return None
        self.status = "suspended"
        self.in_handler = _close_runs_code(child)
        return child.yielded

    def delegating(self) -> bool:
        """Suspended inside `yield from` (the RESUME after its YIELD_VALUE says so): throw() and
        close() would go to the sub-iterator first (not modelled)."""
        nxt = self.translator.instructions[self.translator.ip]
        return nxt.opname == "RESUME" and (nxt.arg or 0) & 3 == 2

    def check_closed_at_end(self, tx) -> None:
        """Refuse, when the trace ends (or breaks), if this generator is left suspended where
        its close() (at garbage collection) would run code of its body."""
        tx.output.side_effects.checks.append(lambda: _check_closed(self))

    def close(self, tx) -> VariableTracker:
        """`close()`: GeneratorExit raised at the suspended `yield`; the body's handlers run.
        Returns what CPython's close returns (None; 3.13+: the value the body returned)."""
        from ferrodyn.variables.exceptions import TracedException, make
        if self.status == "running":
            _raise(tx, ValueError, "generator already executing")
        if self.status != "suspended":
            self.status = "done"  # a created or finished generator: nothing runs
            return ConstantVariable(value=None)
        from ferrodyn.variables.exceptions import set_context
        exit_exc = None
        if self.delegating():  # CPython closes the sub-generator first (the body is running)
            sub = self.translator.stack[-1]
            if not isinstance(sub, GeneratorVariable):
                unsupported(f"close() of generator {self.name} delegating to {sub.describe()}",
                            BreakReason.GENERATOR)
            self.status = "running"
            try:
                sub.frame.close(tx)
                sub.state.exhausted = True
            except TracedException as e:
                exit_exc = e.exc  # the sub-generator's error is raised in the body instead
            finally:
                self.status = "suspended"
        if exit_exc is None:
            exit_exc = make(tx, GeneratorExit, (), {})
            set_context(tx, exit_exc)  # raised in the consumer first (then chained in the body)
        try:
            item = self.resume(tx, throw=exit_exc, closing=True)
        except TracedException as e:
            if issubclass(e.exc.cls, GeneratorExit):
                return ConstantVariable(value=None)
            raise
        if item is not None:  # CPython: RuntimeError, and the body stays suspended
            unsupported(f"generator {self.name} ignored GeneratorExit (yielded in close())",
                        BreakReason.GENERATOR)
        if sys.version_info >= (3, 13):
            return self.return_value
        return ConstantVariable(value=None)


def _raise(tx, cls, msg):
    from ferrodyn.variables.exceptions import TracedException, make
    raise TracedException(make(tx, cls, (ConstantVariable(value=msg),), {}))


def _is_none(v: VariableTracker) -> bool:
    return v.is_python_constant() and v.as_python_constant() is None


def _stopiteration_runtime_error(tx, stop):
    """PEP 479: the RuntimeError a StopIteration `stop` leaving a generator's body becomes;
    `stop` is its `__cause__` and `__context__`, as CPython sets them."""
    from ferrodyn.variables.exceptions import make
    err = make(tx, RuntimeError, (ConstantVariable(value="generator raised StopIteration"),), {})
    err.set_chain("__context__", stop)
    err.set_chain("__cause__", stop)
    err.set_chain("__suppress_context__", True)
    return err


def suspend(tx, value: VariableTracker) -> None:
    """YIELD_VALUE: stop the generator translator `tx` with `value` (its `run()` returns)."""
    tx.yielded = value
    tx.returned = None


def _close_runs_code(tx) -> bool:
    """Whether `close()` of the generator suspended at this `yield` would run code of its body:
    GeneratorExit raised at the yield reaches a `finally`, a `with` exit or an `except` that
    catches it. Decided on the bytecode: the handlers are followed while they only test the
    exception against builtin classes that GeneratorExit is not a subclass of and re-raise
    (`except IndexError:` in `Sequence.__iter__`); anything else counts as running code."""
    import builtins
    from ferrodyn.symbolic.exceptions import _table
    entries, index_of = _table(tx.code)
    insts = tx.instructions

    def handler_of(inst):
        for entry in entries:
            if entry.start <= inst.offset < entry.end:
                return index_of[entry.target]
        return None

    pos = handler_of(insts[tx.ip - 1])
    classes: list = []
    for _ in range(64):
        if pos is None:
            return False  # GeneratorExit leaves the body: close() is silent
        inst = insts[pos]
        pos += 1
        name = inst.opname
        if name in ("PUSH_EXC_INFO", "NOP", "COPY", "POP_EXCEPT", "SWAP") or (
                name == "CALL_INTRINSIC_1" and inst.argrepr == "INTRINSIC_STOPITERATION_ERROR"):
            continue
        if name in ("RERAISE", "CLEANUP_THROW"):  # CLEANUP_THROW re-raises all but StopIteration
            pos = handler_of(inst)
        elif name == "LOAD_GLOBAL" and not inst.argrepr.startswith("NULL") \
                and inst.argval not in tx.f_globals and isinstance(
                    getattr(builtins, inst.argval, None), type):
            classes.append((getattr(builtins, inst.argval),))
        elif name == "BUILD_TUPLE" and len(classes) >= (inst.arg or 0) > 0:
            group = sum(classes[-inst.arg:], ())
            del classes[-inst.arg:]
            classes.append(group)
        elif name == "CHECK_EXC_MATCH" and classes:
            if issubclass(GeneratorExit, classes.pop()):
                return True
            nxt = insts[pos]
            if not (nxt.opname.startswith("POP_JUMP") and nxt.opname.endswith("IF_FALSE")):
                return True
            pos = nxt.target
        else:
            return True
    return True


# ---- the tracker --------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class GeneratorVariable(IteratorVariable):
    """A generator object made while tracing. Its items come from `frame.resume`."""

    frame: GeneratorFrame = None  # type: ignore[assignment]

    @staticmethod
    def make(tx, fn, bound: dict[str, VariableTracker]) -> "GeneratorVariable":
        frame = GeneratorFrame(tx, fn, bound)
        frame.check_closed_at_end(tx)
        return GeneratorVariable(state=IterState([], step=frame.resume), frame=frame)

    def python_type(self):
        return types.GeneratorType

    def describe(self):
        return f"generator {self.frame.name}"

    def var_getattr(self, tx, name):
        from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
        if name in _METHODS:
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        unsupported(f"attribute {name!r} of {self.describe()}", BreakReason.GENERATOR)

    def call_method(self, tx, name, args, kwargs):
        handler = _METHODS.get(name)
        if handler is None:
            return super().call_method(tx, name, args, kwargs)
        return handler(tx, self, *args, **kwargs)

    def has_attr(self, tx, name):
        return instance_has_attr(types.GeneratorType, name)

    def send(self, tx, value: VariableTracker) -> VariableTracker | None:
        """`send(value)`: the next item, or None when the body ends."""
        if self.state.exhausted:
            return None
        item = self.frame.resume(tx, value)
        if item is None:
            self.state.exhausted = True
        return item

    def reconstruct(self, tx):
        unsupported(f"{self.describe()} escapes the frame (returned, stored outside it, or live "
                    f"across a graph break)", BreakReason.GENERATOR)


def _check_closed(frame: GeneratorFrame) -> None:
    """At the end of the trace (SideEffects.replay): a generator suspended inside a try/with
    of its body whose handler would run when it is closed (at garbage collection): the
    close is not modelled."""
    if frame.status == "suspended" and frame.in_handler:
        unsupported(f"generator {frame.name} left suspended inside a try/with block (its "
                    f"handler would run on close)", BreakReason.GENERATOR)


def next_or_raise(tx, it: IteratorVariable) -> VariableTracker:
    """`next(it)`: the next item, or StopIteration raised in the traced code: with the return
    value of a generator that ends in this call, with no args otherwise (as CPython)."""
    from ferrodyn.variables.exceptions import raise_stop_iteration
    fresh = isinstance(it, GeneratorVariable) and not it.state.exhausted
    item = it.next(tx)
    if item is None:
        raise_stop_iteration(tx, it.frame.return_value if fresh else None)
    return item


def _next(tx, gen, *rest):
    if rest:
        unsupported("generator.__next__ with arguments", BreakReason.EXCEPTION)
    return next_or_raise(tx, gen)


def _send(tx, gen, value):
    from ferrodyn.variables.exceptions import raise_stop_iteration
    fresh = not gen.state.exhausted
    item = gen.send(tx, value)
    if item is None:
        raise_stop_iteration(tx, gen.frame.return_value if fresh else None)
    return item


def _close(tx, gen):
    result = gen.frame.close(tx)
    gen.state.exhausted = True
    return result


def _throw(tx, gen, *args, **kwargs):
    """`throw(exc)` (one argument: an exception class or instance made in the trace)."""
    from ferrodyn.symbolic.exceptions import exception_of
    from ferrodyn.variables.exceptions import raise_stop_iteration
    if len(args) != 1 or kwargs:
        unsupported("generator.throw() with more than one argument", BreakReason.GENERATOR)
    exc = exception_of(tx, args[0])
    if gen.state.exhausted or gen.frame.status != "suspended":
        unsupported(f"generator.throw() of {gen.describe()} not suspended at a yield",
                    BreakReason.GENERATOR)
    item = gen.frame.resume(tx, throw=exc)
    if item is None:
        gen.state.exhausted = True
        raise_stop_iteration(tx, gen.frame.return_value)
    return item


_METHODS: dict[str, Callable] = {
    "__next__": _next, "__iter__": lambda tx, gen: gen, "send": _send, "close": _close,
    "throw": _throw,
}


# ---- yield from ---------------------------------------------------------------------------

def yield_from_iter(tx, v: VariableTracker) -> VariableTracker:
    """GET_YIELD_FROM_ITER: a generator delegates as is, anything else through `iter()`."""
    v = tx.realize(v)
    if isinstance(v, GeneratorVariable):
        return v
    return v.iterator(tx)


def send(tx, receiver: VariableTracker, value: VariableTracker) -> tuple[bool, VariableTracker]:
    """SEND: (True, next item) while `receiver` yields, (False, its return value) at its end.
    A generator receives the sent value; another iterator only `None` (`next()`)."""
    value = tx.realize(value)
    if isinstance(receiver, GeneratorVariable):
        item = receiver.send(tx, value)
        return (True, item) if item is not None else (False, receiver.frame.return_value)
    if not isinstance(receiver, IteratorVariable):
        unsupported(f"yield from {receiver.describe()}", BreakReason.GENERATOR)
    if not _is_none(value):
        unsupported(f"send() through yield from {receiver.describe()}", BreakReason.GENERATOR)
    item = receiver.next(tx)
    return (True, item) if item is not None else (False, ConstantVariable(value=None))


def stopiteration_error(tx, exc: VariableTracker) -> VariableTracker:
    """CALL_INTRINSIC_1 INTRINSIC_STOPITERATION_ERROR (3.12+, the handler around a generator's
    body): a StopIteration leaving the body becomes RuntimeError (PEP 479); others pass."""
    from ferrodyn.variables.exceptions import ExceptionVariable
    exc = tx.realize(exc)
    if not isinstance(exc, ExceptionVariable):
        unsupported(f"exception {exc.describe()} leaving a generator", BreakReason.EXCEPTION)
    if issubclass(exc.cls, StopIteration):
        return _stopiteration_runtime_error(tx, exc)
    return exc


__all__ = ["GeneratorFrame", "GeneratorVariable", "MAX_YIELDS"]

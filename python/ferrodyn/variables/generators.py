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
  `next`, `in`, `yield from`) drives it lazily; `send(value)` and `close()` too. A
  StopIteration leaving the body becomes RuntimeError (PEP 479), as in CPython.
- The refusals (never a wrong value): `throw` and frame attributes (`gi_frame`...); a
  generator escaping the frame (returned, stored outside it, live across a graph break: it has
  no reconstruction); a generator left suspended, at the end of the trace or at `close()`,
  where GeneratorExit would run code of its body (a `finally`, a `with`, an `except` catching
  it: CPython runs it when the generator is closed or collected); more than `MAX_YIELDS`
  resumptions (an infinite generator drained by its consumer); a generator resumed while it
  runs.
A graph break inside a generator's body never resumes inside it (its translator takes no
`stop_at`): the break moves out to the root frame's instruction, if that one can resume.
Does not own the opcodes (symbolic/opcodes_control.py: RETURN_GENERATOR, YIELD_VALUE, SEND,
GET_YIELD_FROM_ITER, END_SEND) or when a call makes a generator (symbolic/inline.py).
"""

from __future__ import annotations

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

    def resume(self, tx, sent: VariableTracker | None = None) -> VariableTracker | None:
        """Run the body from where it stopped to its next `yield` (returns the value) or its
        end (returns None; the return value is `return_value`). `tx` is the consumer; `sent`
        is what the `yield` evaluates to (`send(value)`; None for `next()`)."""
        from ferrodyn.symbolic.translator import _RETURNED_NOTHING
        from ferrodyn.variables.exceptions import TracedException
        sent = ConstantVariable(value=None) if sent is None else tx.realize(sent)
        if self.status == "done":
            return None
        if self.status == "running":
            unsupported(f"ValueError: generator {self.name} already executing",
                        BreakReason.EXCEPTION)
        if self.status == "created" and not _is_none(sent):
            unsupported("TypeError: can't send non-None value to a just-started generator",
                        BreakReason.EXCEPTION)
        self.yields += 1
        if self.yields > MAX_YIELDS:
            unsupported(f"generator {self.name} resumed more than {MAX_YIELDS} times "
                        f"(infinite generator?)", BreakReason.GENERATOR)
        child = self.translator
        if self.status == "suspended":
            child.stack.append(sent)  # what `yield` evaluates to
        child.parent = tx
        child.returned = _RETURNED_NOTHING
        child.yielded = None
        self.status = "running"
        try:
            child.run()
        except TracedException as e:
            self.status = "done"
            if issubclass(e.exc.cls, StopIteration):  # 3.11 (3.12+: stopiteration_error)
                raise TracedException(_stopiteration_runtime_error(tx)) from None
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

    def check_closed_at_end(self, tx) -> None:
        """Refuse, when the trace ends (or breaks), if this generator is left suspended where
        its close() (at garbage collection) would run code of its body."""
        tx.output.side_effects.checks.append(lambda: _check_closed(self))

    def close(self) -> None:
        """`close()`: nothing runs unless the body is suspended where GeneratorExit would reach
        its code (refused)."""
        if self.status == "running":
            unsupported(f"ValueError: generator {self.name} already executing",
                        BreakReason.EXCEPTION)
        if self.status == "suspended" and self.in_handler:
            unsupported(f"close() of generator {self.name} suspended inside a try/with block",
                        BreakReason.GENERATOR)
        self.status = "done"


def _is_none(v: VariableTracker) -> bool:
    return v.is_python_constant() and v.as_python_constant() is None


def _stopiteration_runtime_error(tx):
    from ferrodyn.variables.exceptions import make
    return make(tx, RuntimeError, (ConstantVariable(value="generator raised StopIteration"),), {})


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


def _next(tx, gen, *rest):
    if rest:
        unsupported("generator.__next__ with arguments", BreakReason.EXCEPTION)
    item = gen.next(tx)
    if item is None:
        unsupported("StopIteration", BreakReason.EXCEPTION)
    return item


def _send(tx, gen, value):
    item = gen.send(tx, value)
    if item is None:
        unsupported("StopIteration", BreakReason.EXCEPTION)
    return item


def _close(tx, gen):
    gen.frame.close()
    gen.state.exhausted = True
    return ConstantVariable(value=None)


def _throw(tx, gen, *args, **kwargs):
    unsupported(f"generator.throw() of {gen.describe()}", BreakReason.GENERATOR)


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
        return _stopiteration_runtime_error(tx)
    return exc


__all__ = ["GeneratorFrame", "GeneratorVariable", "MAX_YIELDS"]

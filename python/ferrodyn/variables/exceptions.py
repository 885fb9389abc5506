"""Exceptions raised and handled inside the traced code, decided at trace time: the exception
object (`ExceptionVariable`) and the signal that carries it up the translator stack
(`TracedException`) until a frame's exception table has a handler for the raising instruction
(symbolic/exceptions.py unwinds).

Owns the exception object's model: `args`, the chaining attributes (`__context__`,
`__cause__`, `__suppress_context__`: read and written; set by a raise as CPython's
`_PyErr_SetObject` and `raise ... from` set them), `StopIteration.value`, `str()`/`repr()` of
builtin-formatted exceptions, and which exception is being handled (`handled`, what
`sys.exc_info()` and a bare `raise` see across inlined calls and generator bodies).
Anything else (`__traceback__`, `add_note`, attributes set by a user `__init__`) is refused.
An exception object made in the trace leaves it (returned, live at a graph break) only if
it was never raised: `reconstruct` rebuilds it with its args and chaining attributes.

An exception no traced frame handles gives up on the frame (it is an `Unsupported`): eager
raises it for real. Does not own the opcodes (symbolic/exceptions.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.variables.base import VariableTracker, raised_while_tracing, unsupported
from ferrodyn.variables.constant import ConstantVariable

_NONE = ConstantVariable(value=None)
#: whether the extension has the guard leaf `handled` relies on (an older build: refused)
_NO_HANDLED_GUARD = hasattr(__import__("ferrodyn._C", fromlist=["_C"]).GuardBuilder,
                            "no_handled_exception")
_UNKNOWN = object()  # a __context__ set from outside the traced frames
#: the chaining attributes and their value on a new exception
_CHAIN_DEFAULTS = {"__context__": None, "__cause__": None, "__suppress_context__": False}


@dataclass(frozen=True, eq=False)
class ExceptionVariable(VariableTracker):
    """An instance of an exception class made in the traced code: `cls(*args)`."""

    cls: type = Exception
    args: tuple = ()
    raised_at: list = field(default_factory=list)  # (file, line) where first raised
    # __context__ / __cause__ (an ExceptionVariable or None), __suppress_context__ (bool)
    chain: dict = field(default_factory=dict)

    def python_type(self):
        return self.cls

    def describe(self):
        return f"{self.cls.__name__} exception"

    def get_chain(self, name):
        return self.chain.get(name, _CHAIN_DEFAULTS[name])

    def set_chain(self, name, value):
        self.chain[name] = value

    def var_getattr(self, tx, name):
        from ferrodyn.variables.lists import TupleVariable
        if name == "args":
            return TupleVariable(items=tuple(self.args))
        if name == "__class__":
            from ferrodyn.variables.builder import build_unsourced
            return build_unsourced(self.cls)
        if name in _CHAIN_DEFAULTS:
            v = self.get_chain(name)
            if v is _UNKNOWN:  # the caller's handled exception when this one was raised
                try:
                    v = outside_handled(tx)
                except Unsupported:
                    unsupported(f"{name} of {self.describe()}: the exception being handled "
                                f"outside the traced frames is not known", BreakReason.EXCEPTION)
            return v if isinstance(v, VariableTracker) else ConstantVariable(value=v)
        if name == "value" and issubclass(self.cls, StopIteration) and _plain(self.cls):
            return self.args[0] if self.args else _NONE
        if ("attr", name) in self.chain:  # stored by the code (a user __init__)
            return self.chain[("attr", name)]
        unsupported(f"attribute {name!r} of {self.describe()}", BreakReason.EXCEPTION)

    def has_attr(self, tx, name):
        return ("attr", name) in self.chain or hasattr(self.cls, name)

    def setattr(self, tx, name, value):
        value = tx.realize(value)
        if name in ("__context__", "__cause__"):
            if _is_none(value):
                value = None
            elif not isinstance(value, ExceptionVariable):
                unsupported(f"{name} set to {value.describe()}", BreakReason.EXCEPTION)
            self.set_chain(name, value)
            if name == "__cause__":  # BaseException's setter: suppress the context
                self.set_chain("__suppress_context__", True)
            return
        if name == "__suppress_context__" and value.is_python_constant() \
                and isinstance(value.as_python_constant(), bool):
            self.set_chain(name, value.as_python_constant())
            return
        if not _plain(self.cls) and not any(name in vars(k) for k in self.cls.__mro__) \
                and not name.startswith("__"):
            self.chain[("attr", name)] = value  # the instance's __dict__ (no descriptor)
            return
        unsupported(f"setattr {name!r} on {self.describe()}", BreakReason.EXCEPTION)

    def reconstruct(self, tx):
        """A new exception made in the trace and never raised, returned or live at a graph
        break: rebuilt as `cls(*args)` with its chaining attributes, once per entry call.
        Refused when it was raised (eager's has a `__traceback__`), when its class is not
        `_plain` or it holds attributes beyond args, or when its context is unknown."""
        if self.source is not None:
            return super().reconstruct(tx)
        if self.raised_at or not _plain(self.cls) \
                or any(isinstance(k, tuple) for k in self.chain):
            unsupported(f"returning {self.describe()} (raised, or with state beyond its args)",
                        BreakReason.UNSUPPORTED_TYPE)
        chained = [self.get_chain(n) for n in ("__context__", "__cause__")]
        if any(v is _UNKNOWN for v in chained):
            unsupported(f"returning {self.describe()} whose __context__ is not known",
                        BreakReason.EXCEPTION)
        from ferrodyn.trace_result import OutCall, OutConst, OutTuple

        def build():
            args = OutTuple(tuple(tx.realize(a).reconstruct(tx) for a in self.args))
            links = tuple(OutConst(None) if v is None else v.reconstruct(tx) for v in chained)
            return OutCall(rebuild_exception, (OutConst(self.cls), args, *links,
                                               OutConst(self.get_chain("__suppress_context__"))))
        return tx.output.side_effects.shared(self, build)

    def const_value(self, tx):
        """A real instance with the same class and constant args, for `str()`/`repr()`; None
        when a Python `__str__`/`__repr__` could run or an argument is not a constant."""
        if not (_plain(self.cls) and all(a.is_python_constant() for a in self.args)):
            return None
        return self.cls(*(a.as_python_constant() for a in self.args))


def rebuild_exception(cls, args, context, cause, suppress):
    """An exception as `ExceptionVariable.reconstruct` describes it (what `cls(*args)` and the
    attribute stores of the traced code made)."""
    exc = cls(*args)
    exc.__context__ = context
    exc.__cause__ = cause
    exc.__suppress_context__ = suppress
    return exc


def _plain(cls: type) -> bool:
    """Whether `cls` formats, stores its args and reads attributes as its builtin base does."""
    return all(k.__module__ == "builtins" or not any(
        n in vars(k) for n in ("__init__", "__new__", "__str__", "__repr__", "__getattribute__",
                               "__getattr__", "__setattr__")) for k in cls.__mro__)


def _is_none(v) -> bool:
    return v.is_python_constant() and v.as_python_constant() is None


def can_make(cls: type) -> bool:
    """Exception classes whose instances are modelled: builtin ones (Exception's subclasses and
    GeneratorExit), and user subclasses that keep BaseException's `__new__` (a Python
    `__init__` is inlined by `make`)."""
    if not (isinstance(cls, type) and issubclass(cls, (Exception, GeneratorExit))):
        return False
    if cls.__module__ == "builtins":
        return True
    return all(k.__module__ == "builtins" or "__new__" not in vars(k) for k in cls.__mro__)


def _user_init(cls: type):
    """The Python `__init__` `cls(...)` runs, None when it is BaseException's (a builtin)."""
    for k in cls.__mro__:
        if "__init__" in vars(k):
            return None if k.__module__ == "builtins" else vars(k)["__init__"]
    return None


def make(tx, cls: type, args, kwargs) -> ExceptionVariable:
    """`cls(*args, **kwargs)`: BaseException.__new__ stores the positional args; a user
    `__init__` is then inlined with the new exception as `self` (its attribute stores and
    `super().__init__(...)` are modelled, see `ExceptionVariable.setattr`, `base_init`)."""
    import types
    args = tuple(tx.realize(a) for a in args)
    init = _user_init(cls)
    if init is None:
        if kwargs:
            unsupported(f"{cls.__name__}() with keyword arguments", BreakReason.EXCEPTION)
        return ExceptionVariable(cls=cls, args=args)
    if not isinstance(init, types.FunctionType):
        unsupported(f"{cls.__name__}.__init__ is not Python code", BreakReason.UNSUPPORTED_CALL)
    from ferrodyn.variables.builder import build_unsourced
    exc = ExceptionVariable(cls=cls, args=args)
    build_unsourced(init).call_function(tx, [exc, *args], dict(kwargs))
    return exc


@dataclass(frozen=True, eq=False)
class BaseInitVariable(VariableTracker):
    """`super().__init__` of an exception whose class has a Python `__init__`, reaching
    BaseException's: the call sets `args` (keyword arguments: TypeError, refused)."""

    exc: ExceptionVariable = None  # type: ignore[assignment]

    def describe(self):
        return "BaseException.__init__"

    def call_function(self, tx, args, kwargs):
        if kwargs:
            unsupported("BaseException.__init__() with keyword arguments",
                        BreakReason.EXCEPTION)
        object.__setattr__(self.exc, "args", tuple(tx.realize(a) for a in args))
        return _NONE


def base_init(exc: ExceptionVariable) -> VariableTracker:
    return BaseInitVariable(exc=exc)


def from_real(exc: BaseException) -> ExceptionVariable | None:
    """The tracker of an exception a builtin operation on constants raised while tracing (the
    same operation raises the same exception in eager), or None when it is not modelled
    exactly (a class with more state than its args, a non-constant arg, a chained one)."""
    from ferrodyn.variables.constant import is_constant_value
    cls = type(exc)
    if cls.__module__ != "builtins" or not can_make(cls) or issubclass(cls, OSError) \
            or exc.__cause__ is not None or exc.__context__ is not None \
            or getattr(exc, "__notes__", None) or not all(is_constant_value(a) for a in exc.args):
        return None
    return ExceptionVariable(cls=cls, args=tuple(ConstantVariable(value=a) for a in exc.args))


def raise_real(exc: BaseException, construct: str) -> None:
    """Raise the traced version of `exc` (see `from_real`), or refuse naming `construct`."""
    v = from_real(exc)
    if v is None:
        raised_while_tracing(f"{construct} raised {type(exc).__name__}: {exc}")
    raise TracedException(v)


def handled(tx) -> VariableTracker | None:
    """The exception being handled where `tx` runs (CPython's topmost exc_info): the innermost
    handler of this frame or, without one, of its callers (an inlined call and a generator's
    body see their caller's); without one in the trace, the compiled frame's caller's
    (`outside_handled`)."""
    found, value = _handled_in_trace(tx)
    return value if found else outside_handled(tx)


def _handled_in_trace(tx):
    while tx is not None:
        if tx.exc_stack:
            return True, tx.exc_stack[-1]
        tx = tx.parent
    return False, None


def outside_handled(tx) -> None:
    """The exception the compiled frame's caller (for a resume function: the frame it
    continues) is handling. Tracing runs inside the frame's call, so the thread's handled
    exception is the caller's: when there is none, the trace relies on that and guards it
    (`sys.exception() is None`, checked before every run of the entry); one being handled is
    not modelled (refused)."""
    if sys.exc_info()[1] is None and _NO_HANDLED_GUARD:
        from ferrodyn.guard_spec import GuardKind
        tx.output.install_guard(None, GuardKind.NO_HANDLED_EXCEPTION)
        return None
    unsupported("the exception being handled outside the traced frames is not known",
                BreakReason.EXCEPTION)


def set_context(tx, exc: ExceptionVariable) -> None:
    """What a `raise` (and an exception from a builtin) does to the new exception: its
    `__context__` becomes the exception being handled, after cutting the link that would make
    the chain a cycle (CPython's `_PyErr_SetObject`, whose walk stops on a cycle already in
    the chain)."""
    found, current = _handled_in_trace(tx)
    if not found:  # the caller's, decided when the context is read (`outside_handled`)
        exc.set_chain("__context__", _UNKNOWN)
        return
    chain_to(current, exc)


def chain_to(current: VariableTracker | None, exc: ExceptionVariable) -> None:
    """`set_context` with the handled exception given (`generator.throw()` chains to the
    generator's own, not to its consumer's)."""
    if current is None or _is_none(current) or current is exc:
        return
    if not isinstance(current, ExceptionVariable):
        unsupported(f"raise while handling {current.describe()}", BreakReason.EXCEPTION)
    # CPython's walk (Floyd's cycle detection: `slow` steps every other time): the link to
    # `exc` is cut; a cycle that does not contain `exc` stops the walk where `o` meets `slow`
    o = slow = current
    toggle = False
    while True:
        ctx = o.get_chain("__context__")
        if ctx is None:
            break
        if ctx is _UNKNOWN:
            # the rest of the chain existed before the frame ran; `exc` was made in the trace
            # (ExceptionVariable), so it cannot be in it: no cycle to cut there
            break
        if ctx is exc:
            o.set_chain("__context__", None)
            break
        o = ctx
        if o is slow:
            break
        if toggle:
            slow = slow.get_chain("__context__")
        toggle = not toggle
    exc.set_chain("__context__", current)


class TracedException(Unsupported):
    """Control-flow signal: `exc` was raised at the current instruction of the innermost
    translator. A translator with a handler catches it; past the root frame it is a refusal
    that names where the exception was first raised."""

    def __init__(self, exc: ExceptionVariable, chain: bool = True):
        where = exc.raised_at[0] if exc.raised_at else (None, None)
        super().__init__(f"uncaught {exc.cls.__name__} raised in the traced code",
                         BreakReason.EXCEPTION, filename=where[0], lineno=where[1])
        self.exc = exc
        self.chain = chain  # a new raise: unwinding sets its __context__ (not a re-raise)


@dataclass(frozen=True, eq=False)
class TracebackVariable(VariableTracker):
    """The traceback `sys.exc_info()` returns and `__exit__` receives (symbolic/opcodes_with.py):
    only its identity is modelled (`tb is None`); anything else (frames, line numbers,
    reconstruction) is refused."""

    def python_type(self):
        import types
        return types.TracebackType

    def describe(self):
        return "traceback object"


def _exc_info(tx):
    from ferrodyn.variables.builder import build_unsourced
    from ferrodyn.variables.lists import TupleVariable
    current = handled(tx)
    if current is None or _is_none(current):
        return TupleVariable(items=(_NONE, _NONE, _NONE))
    if not isinstance(current, ExceptionVariable):
        unsupported(f"sys.exc_info() while handling {current.describe()}", BreakReason.EXCEPTION)
    return TupleVariable(items=(build_unsourced(current.cls), current, TracebackVariable()))


def _exception(tx):
    current = handled(tx)
    if current is not None and not _is_none(current) \
            and not isinstance(current, ExceptionVariable):
        unsupported(f"sys.exception() while handling {current.describe()}", BreakReason.EXCEPTION)
    return _NONE if current is None else current


#: the builtins that read the exception being handled (builtins.BUILTIN_HANDLERS takes them)
HANDLERS: dict = {}


def _register():
    import sys
    HANDLERS[sys.exc_info] = _exc_info
    if hasattr(sys, "exception"):  # 3.11+
        HANDLERS[sys.exception] = _exception


_register()


def raise_stop_iteration(tx, value: VariableTracker | None = None) -> None:
    """An exhausted iterator's `next()` (`value`: a generator's return value, None for others:
    CPython's StopIteration has no args then)."""
    args = () if value is None or _is_none(value) else (value,)
    raise TracedException(ExceptionVariable(cls=StopIteration, args=args))


def raise_attribute_error(tx, cls: type, name: str) -> None:
    """The AttributeError of `object.__getattribute__` for an instance of `cls` without `name`
    (CPython's message; a type name it would truncate is refused)."""
    if len(cls.__name__) > 50 or not isinstance(name, str):
        unsupported(f"AttributeError: {cls.__name__!r} object has no attribute {name!r}",
                    BreakReason.EXCEPTION)
    msg = f"'{cls.__name__}' object has no attribute '{name}'"
    raise TracedException(ExceptionVariable(cls=AttributeError,
                                            args=(ConstantVariable(value=msg),)))

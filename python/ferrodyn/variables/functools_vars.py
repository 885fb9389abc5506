"""Trackers for callables that hold state or arguments: the callables of `operator`
(`itemgetter`, `attrgetter`, `methodcaller`, made in the frame or read from it, guarded by
identity; their arguments are constants fixed at creation), `functools.lru_cache` /
`functools.cache` wrappers, and `functools.partial` objects.

Owns `OperatorGetterVariable` and the handlers that make one, `LruCacheVariable`, and
`PartialVariable` (read from the frame or made in it, called, and rebuilt by `make_partial`
when it outlives the trace). Does not own the plain `operator` functions (builtins.py) or the
function a partial wraps (functions.py).

The rule for a call of an lru_cache wrapper. CPython's call looks the arguments up in the
cache: a hit returns the *cached object* (the same object every time: identity matters for a
mutable result) and runs nothing; a miss runs the body and stores the result. torch.compile
ignores the cache and traces `__wrapped__`, which runs the body's effects again, hands back a
new object instead of the cached one, and leaves the cache and its statistics untouched.
ferrodyn instead makes the call itself, at trace time, with the real cache:
  - every argument must be a hashable constant (guarded by value through its source) or an
    object that hashes by identity (guarded by ID_MATCH); anything else — tensors, lists,
    symbolic ints — is refused (the call runs eagerly at a graph break): whether such a key
    hits, and which object a hit returns, depends on the cache's contents, which the trace
    cannot see;
  - no mutation may be pending in the trace (the body would read state that eager code would
    have changed first): refused otherwise, unless the call provably runs no body or the body
    reads no state the frame can change (`_runs_no_pending_reader`): a function marked
    constant for the process (`torch._dynamo.assume_constant_result`'s
    `_dynamo_marked_constant`, the promise transformers' install probes make under their
    lru_cache), or a call with no arguments of a function that takes none whose cache already
    holds an entry (`cache_info().currsize`: every successful call of such a function has the
    one key `()`, so the call is a hit: the cached object, no body);
  - the call is the capturing run's own call (hit or miss exactly as eager, the body's effects
    once); its result must be an immutable constant, baked into the trace (a mutable cached
    object, a tensor: refused — the frame then runs eagerly, which costs the cache one more
    hit, never a wrong value);
  - compiled re-runs (guards pass: same wrapper, same arguments) return that constant without
    calling the wrapper, as every eager re-run's cache hit returns it. What they do not do is
    update the cache's hit count or LRU order, nor see a `cache_clear()` (the wrapper's cache is
    not guardable): a function whose result for equal arguments changes once its cache is
    cleared is outside this rule (`ferrodyn.disable` it or keep the call outside the region).
`cache_info()`, `cache_clear()` and other attributes of the wrapper are refused, except the
plain function attributes (`__wrapped__`, `__name__`, ...).
"""

from __future__ import annotations

import functools
import inspect
import operator
import types
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


# ---- functools.lru_cache / functools.cache wrappers -----------------------------------------

LRU_WRAPPER = functools._lru_cache_wrapper
_WRAPPER_ATTRS = ("__wrapped__", "__name__", "__qualname__", "__module__", "__doc__")
_IDENTITY_CONSTANTS = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)


def _cache_key_arg(tx, wrapper: "LruCacheVariable", arg: VariableTracker) -> Any:
    from ferrodyn.variables.user_objects import _ABSENT, identity_dict_key
    arg = tx.realize(arg)
    obj = identity_dict_key(tx, arg)
    if obj is not _ABSENT:
        return obj
    if arg.is_python_constant():
        value = arg.as_python_constant()
        if is_constant_value(value) or isinstance(value, _IDENTITY_CONSTANTS):
            return value
    unsupported(f"call of {wrapper.describe()} with a {arg.describe()} argument (whether the "
                f"cache hits, and with which object, depends on its contents)",
                BreakReason.UNSUPPORTED_CALL)


@dataclass(frozen=True, eq=False)
class LruCacheVariable(VariableTracker):
    """A `functools.lru_cache`/`functools.cache` wrapper (`value`), called by the rule of the
    module docstring."""

    value: Any = None

    def python_type(self):
        return type(self.value)

    def identity(self):
        return ("obj", id(self.value))

    def describe(self):
        return f"lru_cache-wrapped {getattr(self.value, '__qualname__', '?')}"

    def var_getattr(self, tx, name):
        if name in _WRAPPER_ATTRS and name in getattr(self.value, "__dict__", {}):
            from ferrodyn.source import AttrSource
            from ferrodyn.variables.builder import build
            return build(tx, getattr(self.value, name),
                         AttrSource(self.source, name) if self.source is not None else None)
        unsupported(f"attribute {name!r} of {self.describe()} (the cache is not modelled)",
                    BreakReason.UNSUPPORTED_CALL)

    def has_attr(self, tx, name):
        return hasattr(self.value, name)

    def _runs_no_pending_reader(self, args, kwargs) -> bool:
        """Whether the call reads no state pending mutations change (module docstring)."""
        fn = getattr(self.value, "__wrapped__", None)
        if getattr(fn, "_dynamo_marked_constant", False) is True:
            return True
        code = getattr(fn, "__code__", None)
        if args or kwargs or type(fn) is not types.FunctionType or code is None:
            return False
        takes_none = code.co_argcount == 0 and code.co_kwonlyargcount == 0 and \
            not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        return takes_none and self.value.cache_info().currsize >= 1

    def call_function(self, tx, args, kwargs):
        if tx.output.side_effects.has_effects and not self._runs_no_pending_reader(args, kwargs):
            unsupported(f"call of {self.describe()} while mutations are pending in the trace",
                        BreakReason.UNSUPPORTED_CALL)
        pos = [_cache_key_arg(tx, self, a) for a in args]
        kw = {k: _cache_key_arg(tx, self, v) for k, v in kwargs.items()}
        try:
            result = self.value(*pos, **kw)
        except Exception as e:  # eager raises it: the frame runs eagerly and does
            unsupported(f"{self.describe()} raised {type(e).__name__}: {e}",
                        BreakReason.EXCEPTION)
        if not is_constant_value(result):
            unsupported(f"{self.describe()} returned a {type(result).__name__} (a cached object "
                        f"whose identity matters)", BreakReason.UNSUPPORTED_CALL)
        return ConstantVariable(value=result)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        if self.source is not None:
            return super().reconstruct(tx)
        return OutConst(self.value)


def build_lru_wrapper(tx, value, source) -> LruCacheVariable:
    """An lru_cache wrapper read from the frame: guarded by identity."""
    from ferrodyn.guard_spec import GuardKind
    tx.output.install_guard(source, GuardKind.ID_MATCH, value)
    return LruCacheVariable(source=source, value=value)


# ---- functools.partial ------------------------------------------------------------------------

def make_partial(func, args: tuple, keywords: dict):
    """What the entry calls to rebuild a partial made in the frame: `partial(func, *args,
    **keywords)` as CPython makes it (flattening a plain partial `func`), whose `keywords` is
    the rebuilt dict object itself when not flattened (the frame's `p.keywords` and `p` share
    it, as in eager code)."""
    p = functools.partial(func, *args, **keywords)
    if p.func is func:
        p.__setstate__((func, tuple(args), keywords, None))
    return p


@dataclass(frozen=True, eq=False)
class PartialVariable(VariableTracker):
    """`functools.partial(func, *args, **keywords)`, read from the frame (`source`; its
    `keywords` is a LazyVariable of the real dict, so stores into `p.keywords` are replayed) or
    made while tracing (`keywords` is a new DictVariable; rebuilt once per entry call by
    `make_partial` when it outlives the trace: returned, stored, live at a graph break).

    CPython flattens `partial(p, ...)` of a plain partial `p` without instance attributes into
    one partial (`func`, `args` and `keywords` merged). A partial made in the frame is flattened
    here the same way; over a partial from outside the frame (whose `__dict__` the trace does
    not see) it is kept nested (`over_existing`): calls are the same either way, its
    `func`/`args`/`keywords` are refused, and the rebuilt object is made by CPython's rule."""

    func: VariableTracker = None  # type: ignore[assignment]
    args: tuple = ()
    keywords: Any = None
    over_existing: bool = False

    def __post_init__(self):
        if self.keywords is None or isinstance(self.keywords, dict):
            from ferrodyn.variables.dicts import DictVariable
            object.__setattr__(self, "keywords", DictVariable.new(self.keywords or {}))

    @staticmethod
    def make(tx, func: VariableTracker, args, kwargs: dict) -> "PartialVariable":
        """`functools.partial(func, *args, **kwargs)` called in the frame."""
        from ferrodyn.variables.dicts import DictVariable
        func = tx.realize(func)
        if isinstance(func, ConstantVariable) and not callable(func.value):
            unsupported("TypeError: the first argument of functools.partial must be callable",
                        BreakReason.EXCEPTION)
        if isinstance(func, PartialVariable) and func.source is None and not func.over_existing:
            merged = {**func.keyword_items(tx), **kwargs}
            return PartialVariable(func=func.func, args=(*func.args, *args),
                                   keywords=DictVariable.new(merged))
        return PartialVariable(func=func, args=tuple(args), keywords=DictVariable.new(kwargs),
                               over_existing=isinstance(func, PartialVariable))

    def keyword_items(self, tx) -> dict:
        """The keywords as they are now (a store into `p.keywords` in the frame included)."""
        kw = tx.realize(self.keywords)
        items = getattr(getattr(kw, "state", None), "items", None)
        if not isinstance(items, dict) or not all(isinstance(k, str) for k in items):
            unsupported(f"keywords of {self.describe()} that are not a dict of str keys",
                        BreakReason.UNSUPPORTED_TYPE)
        return items

    def describe(self):
        return f"partial({self.func.describe()})"

    def python_type(self):
        return functools.partial

    def call_function(self, tx, args, kwargs):
        return tx.realize(self.func).call_function(tx, [*self.args, *args],
                                                   {**self.keyword_items(tx), **kwargs})

    def var_getattr(self, tx, name):
        from ferrodyn.variables.lists import TupleVariable
        if name in ("func", "args", "keywords"):
            if self.over_existing:
                unsupported(f"attribute {name!r} of a partial of a partial from outside the "
                            f"frame (CPython flattens it or not by the inner one's __dict__)",
                            BreakReason.UNSUPPORTED_TYPE)
            if name == "func":
                return self.func
            if name == "args":
                return TupleVariable(items=tuple(self.args))
            return self.keywords
        return super().var_getattr(tx, name)

    def has_attr(self, tx, name):
        from ferrodyn.variables.base import instance_has_attr
        if instance_has_attr(functools.partial, name):
            return True
        if self.source is None:  # made in the frame: no instance attributes (setattr refused)
            return False
        unsupported(f"hasattr({self.describe()}, {name!r}): the partial's instance __dict__ "
                    f"is not modelled", BreakReason.UNSUPPORTED_TYPE)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutCall, OutTuple
        if self.source is not None:
            return super().reconstruct(tx)
        self.keyword_items(tx)

        def build():
            return OutCall(make_partial, (
                tx.realize(self.func).reconstruct(tx),
                OutTuple(tuple(tx.realize(a).reconstruct(tx) for a in self.args)),
                tx.realize(self.keywords).reconstruct(tx)))
        return tx.output.side_effects.shared(self, build)

"""Python builtins and pure stdlib functions (`operator`, `math`), dispatched by table.

Owns `BuiltinVariable` (a builtin function or builtin type such as `int`, `list`), the
`BUILTIN_HANDLERS` table (one small function per builtin: len, isinstance, range, zip, min,
getattr, super, ...), the allow-list of functions safe to constant-fold, and the calls replayed
after the graph (`warnings.warn`). Anything not in a table is unsupported.
Does not own operators between trackers (operators.py), which several entries delegate to.
"""

from __future__ import annotations

import builtins
import collections
import functools
import inspect
import math
import operator
import sys
import warnings
from dataclasses import dataclass
from types import FunctionType
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.variables import contextlib_vars, dict_objects, functools_vars, inspect_vars
from ferrodyn.variables import copy_protocol, dunder_new, itertools_vars, namedtuple_vars
from ferrodyn.variables import exceptions
from ferrodyn.variables import sym_int
from ferrodyn.variables import operators as ops
from ferrodyn.variables.base import (
    VariableTracker, instance_has_attr, raised_while_tracing, unsupported)
from ferrodyn.variables.constant import ConstantVariable, fold, is_constant_value, wrap_constant
from ferrodyn.variables.dicts import DictVariable, dict_key
from ferrodyn.variables.lists import IteratorVariable, ListVariable, TupleVariable


def _c(v) -> ConstantVariable:
    return ConstantVariable(value=v)


def _consts(tx, args, *, copies_ok: bool = False) -> list | None:
    """The constant values of `args`, or None. Only immutable values unless `copies_ok` (the
    caller runs a pure function that returns a new scalar): `as_python_constant()` of a list,
    dict or set tracker is a *copy*, which a folded function could mutate (`list.append(xs, 3)`)
    or return in place of the original object (`max([xs, ys])`)."""
    vals = []
    for a in args:
        a = tx.realize(a)
        if not a.is_python_constant():
            return None
        value = a.as_python_constant()
        if not copies_ok and not is_constant_value(value):
            return None
        vals.append(value)
    return vals


def _items_consts(tx, args) -> list | None:
    """`_consts` with copies, reading the items of list and tuple trackers (a frame's list
    holds its items unbuilt until used: building each guards it)."""
    vals = []
    for a in args:
        a = tx.realize(a)
        if isinstance(a, (ListVariable, TupleVariable)):
            items = _items_consts(tx, a.unpack(tx))
            if items is None:
                return None
            vals.append(a.python_type()(items))
            continue
        got = _consts(tx, [a], copies_ok=True)
        if got is None:
            return None
        vals.extend(got)
    return vals


def _const_arg(tx, v: VariableTracker, what: str) -> Any:
    v = sym_int.concrete(tx, v)  # range(s): specialised under a shape guard
    if not v.is_python_constant():
        unsupported(f"{what} with a non-constant argument {v.describe()}",
                    BreakReason.DATA_DEPENDENT)
    return v.as_python_constant()


# ---- handlers (tx, *args, **kwargs) ------------------------------------------------------------

def _len(tx, obj):
    obj = tx.realize(obj)
    if not instance_has_attr(obj.python_type(), "__len__"):  # iterators, generators...
        unsupported(f"TypeError: len() of {obj.describe()}", BreakReason.EXCEPTION)
    return _c(obj.length(tx))


def _type_of(tx, v: VariableTracker) -> type:
    return tx.realize(v).python_type()


def _classinfo(tx, classinfo):
    """A class, tuple of classes or `typing` alias (`typing.List`, `typing.Mapping`: objects
    of typing's own types, identified by identity) for isinstance/issubclass."""
    from ferrodyn.guard_spec import GuardKind
    v = tx.realize(classinfo)
    value = getattr(v, "value", None)
    if not v.is_python_constant() and type(value).__module__ == "typing":
        if v.source is not None:
            tx.output.install_guard(v.source, GuardKind.ID_MATCH, value)
        return value
    if isinstance(v, TupleVariable):
        return tuple(_classinfo(tx, i) for i in v.unpack(tx))
    return _const_arg(tx, v, "isinstance")


def _isinstance(tx, obj, classinfo):
    cls = _classinfo(tx, classinfo)
    from ferrodyn.variables.instancecheck import metaclass_isinstance
    decided = metaclass_isinstance(tx, tx.realize(obj), cls)  # a metaclass's __instancecheck__
    if decided is not None:
        return _c(decided)
    try:
        return _c(issubclass(_type_of(tx, obj), cls))
    except TypeError as e:
        raised_while_tracing(str(e))


def _issubclass(tx, cls, classinfo):
    return _c(fold(issubclass, _const_arg(tx, cls, "issubclass"),
                   _const_arg(tx, classinfo, "issubclass")))


def _range(tx, *args):
    return _c(fold(range, *[_const_arg(tx, a, "range") for a in args]))


def _items(tx, iterable) -> list:
    return tx.realize(iterable).iterator(tx).unpack(tx)


def _enumerate(tx, iterable, start=None):
    from ferrodyn.variables.lists import enumerate_iterator
    first = 0 if start is None else _const_arg(tx, start, "enumerate")
    return enumerate_iterator(tx, iterable, first)


def _zip(tx, *iterables, strict=None):
    from ferrodyn.variables.lists import zip_iterator
    return zip_iterator(tx, iterables, strict is not None and bool(_const_arg(tx, strict, "zip")))


def _reversed(tx, seq):
    from ferrodyn.variables.lists import reversed_iterator
    return reversed_iterator(tx, seq)


def _minmax(fn):
    def handler(tx, *args, key=None, default=None):
        from ferrodyn.variables.lists import each_item
        key_fn = None if key is None else tx.realize(key)
        items, key_vals = [], []
        for item in (each_item(tx, args[0]) if len(args) == 1 else args):
            items.append(item)  # the key runs as each item is taken, as in CPython
            if key_fn is not None:
                key_vals.append(key_fn.call_function(tx, [item], {}))
        if not items and default is not None:
            return default
        if key is not None:
            keys = _consts(tx, key_vals)
            if keys is None:
                unsupported(f"{fn.__name__}() by non-constant keys", BreakReason.DATA_DEPENDENT)
            if not items:
                unsupported(f"{fn.__name__}() of an empty sequence", BreakReason.EXCEPTION)
            best = fn(range(len(items)), key=lambda n: keys[n])
            return items[best]
        symbolic = sym_int.sym_minmax(tx, fn, items)  # max(s, 1): torch.sym_max
        if symbolic is not None:
            return symbolic
        vals = _consts(tx, items)
        if vals is None:
            unsupported(_minmax_refusal(tx, fn, items), BreakReason.DATA_DEPENDENT)
        return _c(fold(fn, vals))
    return handler


def _minmax_refusal(tx, fn, items) -> str:
    """Why min()/max() over these items is not captured: CPython returns one of the argument
    *objects*, chosen by `bool(b > a)`; with a tensor that choice (and so the result's type,
    identity and dtype) depends on its data, which no single graph expresses exactly."""
    from ferrodyn.variables.tensor import TensorVariable
    if any(isinstance(tx.realize(i), TensorVariable) for i in items):
        return (f"{fn.__name__}() with a tensor argument returns whichever argument object "
                "compares greater (bool() of a tensor comparison: data-dependent object and "
                "type); torch.maximum/torch.minimum or torch.clamp compute it in the graph")
    return f"{fn.__name__}() over non-constants"


def _abs(tx, x):
    return ops.unary_op(tx, operator.abs, x)


def _sum(tx, iterable, start=None):
    from ferrodyn.variables.lists import each_item
    acc = _c(0) if start is None else start
    for item in each_item(tx, iterable):  # added as taken, as CPython does
        acc = ops.binary_op(tx, operator.add, acc, item)
    return acc


def _any(tx, iterable):  # stops at the deciding item: a generator is not run further
    from ferrodyn.variables.lists import each_item
    return _c(any(tx.realize(i).truth(tx) for i in each_item(tx, iterable)))


def _all(tx, iterable):
    from ferrodyn.variables.lists import each_item
    return _c(all(tx.realize(i).truth(tx) for i in each_item(tx, iterable)))


def _getattr(tx, obj, name, default=None):
    attr = _const_arg(tx, name, "getattr")
    obj = tx.realize(obj)
    if default is not None and not obj.has_attr(tx, attr):
        return default
    return obj.var_getattr(tx, attr)


def _hasattr(tx, obj, name):
    return _c(tx.realize(obj).has_attr(tx, _const_arg(tx, name, "hasattr")))


def _setattr(tx, obj, name, value):
    tx.realize(obj).setattr(tx, _const_arg(tx, name, "setattr"), value)
    return _c(None)


def _type(tx, obj, *rest):
    if rest:
        unsupported("type() with 3 arguments", BreakReason.UNSUPPORTED_BUILTIN)
    from ferrodyn.variables.builder import build_unsourced
    from ferrodyn.variables.user_objects import ClassVariable, UserObjectVariable
    v, t = tx.realize(obj), _type_of(tx, obj)
    var = build_unsourced(t)
    if isinstance(var, ClassVariable) and isinstance(v, UserObjectVariable) and \
            v.source is not None:  # (objmodel) reached as type(obj): its attributes guarded
        from ferrodyn.source import TypeSource
        return ClassVariable(source=TypeSource(v.source), value=t)
    return var


def _tuple(tx, iterable=None):
    return TupleVariable(items=tuple(_items(tx, iterable) if iterable is not None else ()))


def _list(tx, iterable=None):
    return ListVariable.new(_items(tx, iterable) if iterable is not None else [])


def _ordered_dict(tx, /, *args, **kwargs):
    d = _dict(tx, *args, **kwargs)
    d.state.cls = collections.OrderedDict
    return d


def _dict(tx, /, *args, **kwargs):  # positional-only: `dict(arg=1)`, `dict(tx=1)` are keys
    from ferrodyn.variables.dicts import _update
    d = DictVariable.new({})
    _update(tx, d, *args, **kwargs)
    return d


def _scalar(fn):
    def handler(tx, *args):
        vals = _consts(tx, args, copies_ok=True)  # int/str/repr/format... of a copy: pure
        if vals is None:
            v = tx.realize(args[0])
            if fn is bool:
                return _c(v.truth(tx))
            symbolic = sym_int.sym_convert(tx, fn, v) if len(args) == 1 else None
            if symbolic is not None:  # int(s) of a SymInt
                return symbolic
            vals = _consts(tx, [sym_int.concrete(tx, a) for a in args], copies_ok=True)
            if vals is not None:  # str(s), format(s, "d"): specialised under a shape guard
                return _c(fold(fn, *vals))
            const = getattr(v, "const_value", None)
            if const is not None and const(tx) is not None and len(args) == 1:
                return _c(fold(fn, const(tx)))
            unsupported(f"{fn.__name__}() of {v.describe()}", BreakReason.DATA_DEPENDENT)
        return _c(fold(fn, *vals))
    return handler


def _iter(tx, obj, *rest):
    if rest:
        unsupported("iter(callable, sentinel)", BreakReason.UNSUPPORTED_BUILTIN)
    return tx.realize(obj).iterator(tx)


def _next(tx, it, default=None):
    it = tx.realize(it)
    if not isinstance(it, IteratorVariable):
        unsupported(f"next() of {it.describe()}", BreakReason.UNSUPPORTED_BUILTIN)
    if default is None:
        from ferrodyn.variables.generators import next_or_raise
        return next_or_raise(tx, it)
    item = it.next(tx)
    if item is None:
        return default
    return item


def _callable(tx, obj):
    """CPython: `callable(o)` is whether `type(o)` has a `__call__` slot; the tracker's
    python_type() is exact or refuses, so no kind of tracker is guessed."""
    cls = _type_of(tx, obj)
    return _c(any("__call__" in vars(klass) for klass in cls.__mro__))


def _sorted(tx, iterable, key=None, reverse=None):
    from ferrodyn.variables.sets import SetVariable
    iterable = tx.realize(iterable)
    items = iterable.unordered(tx) if isinstance(iterable, SetVariable) and key is None else None
    lst = ListVariable.new(items if items is not None else _items(tx, iterable))
    from ferrodyn.variables.lists import _sort
    _sort(tx, lst, key, reverse)
    return lst


def _map(tx, fn, *iterables):
    from ferrodyn.variables.lists import map_iterator
    if not iterables:
        unsupported("map() must have at least two arguments", BreakReason.EXCEPTION)
    return map_iterator(tx, tx.realize(fn), iterables)


def _filter(tx, fn, iterable):
    from ferrodyn.variables.lists import filter_iterator
    return filter_iterator(tx, tx.realize(fn), iterable)


def _super(tx, *args):
    from ferrodyn.variables.super_vars import SuperVariable
    if not args:
        cls, obj = tx.zero_arg_super()
    else:
        cls, obj = _const_arg(tx, args[0], "super"), tx.realize(args[1])
    return SuperVariable(cls=cls, obj=obj)


def _slice(tx, *args):
    return _c(slice(*[_const_arg(tx, a, "slice") for a in args]))


def _tuple_new(tx, cls, iterable=None):
    from ferrodyn.variables.namedtuple_vars import NamedTupleVariable
    from ferrodyn.variables.user_objects import is_namedtuple_class
    klass = _const_arg(tx, cls, "tuple.__new__")
    items = _items(tx, iterable) if iterable is not None else []
    if klass is tuple:
        return TupleVariable(items=tuple(items))
    if is_namedtuple_class(klass):
        return NamedTupleVariable.make(klass, items)
    unsupported(f"tuple.__new__({klass.__name__})", BreakReason.UNSUPPORTED_BUILTIN)


def _partial(tx, func, *args, **kwargs):
    from ferrodyn.variables.functions import PartialVariable
    return PartialVariable.make(tx, func, args, kwargs)


def _set(tx, iterable=None):
    from ferrodyn.variables.sets import make_set
    return make_set(tx, iterable)


def _frozenset(tx, iterable=None):
    from ferrodyn.variables.sets import make_set
    return make_set(tx, iterable, frozen=True)


def _reduce(tx, fn, iterable, *initial):
    from ferrodyn.variables.lists import each_item
    fn = tx.realize(fn)
    acc = initial[0] if initial else None
    for item in each_item(tx, iterable):  # fn runs as each item is taken, as in CPython
        acc = item if acc is None else fn.call_function(tx, [acc, item], {})
    if acc is None:
        unsupported("TypeError: reduce() of empty iterable with no initial value",
                    BreakReason.EXCEPTION)
    return acc


def _pow(tx, base, exp, mod=None):
    if mod is not None:
        return _scalar(pow)(tx, base, exp, mod)
    return ops.binary_op(tx, operator.pow, base, exp)


def _round(tx, number, ndigits=None):
    return _scalar(round)(tx, *([number] if ndigits is None else [number, ndigits]))


def _unsupported(name, reason):
    def handler(tx, *args, **kwargs):
        unsupported(f"{name}()", reason)
    return handler


def _object_setattr(tx, obj, name, value):
    from ferrodyn.variables.user_objects import NewObjectVariable, UserObjectVariable
    obj = tx.realize(obj)
    if not isinstance(obj, (NewObjectVariable, UserObjectVariable)):
        unsupported(f"object.__setattr__ on {obj.describe()}", BreakReason.SIDE_EFFECT)
    obj.raw_setattr(tx, _const_arg(tx, name, "object.__setattr__"), value)
    return _c(None)


def _object_getattribute(tx, obj, name):
    """`object.__getattribute__(obj, name)`: the generic lookup, past any override."""
    from ferrodyn.variables.user_objects import ObjectLike
    obj, attr = tx.realize(obj), _const_arg(tx, name, "object.__getattribute__")
    if isinstance(obj, ObjectLike):
        return obj.generic_getattr(tx, attr)
    return obj.var_getattr(tx, attr)


def _id(tx, obj):
    """`id(obj)` of an object the tracker holds (identity key `("obj", id)`): from the frame it
    is guarded by identity; trackers of values made in the frame have no id yet: refused."""
    from ferrodyn.guard_spec import GuardKind
    v = tx.realize(obj)
    value = getattr(v, "value", getattr(v, "fn", None))
    if value is None or v.identity() != ("obj", id(value)):
        unsupported(f"id() of {v.describe()}", BreakReason.UNSUPPORTED_BUILTIN)
    if v.source is not None:
        tx.output.install_guard(v.source, GuardKind.ID_MATCH, value)
    return _c(id(value))


def _hash(tx, obj):
    """`hash(obj)`: folded for immutable constants; for an object hashed by identity (its type
    keeps object's `__hash__`) read from the frame, its real hash, guarded by identity; else
    refused (a user `__hash__` is not inlined, a new object has no hash yet)."""
    v = tx.realize(obj)
    if v.is_python_constant() and is_constant_value(v.as_python_constant()):
        return _c(fold(hash, v.as_python_constant()))
    value = getattr(v, "value", getattr(v, "fn", None))
    if value is not None and v.identity() == ("obj", id(value)) and \
            type(value).__hash__ is object.__hash__:
        from ferrodyn.guard_spec import GuardKind
        if v.source is not None:
            tx.output.install_guard(v.source, GuardKind.ID_MATCH, value)
        return _c(hash(value))
    unsupported(f"hash() of {v.describe()}", BreakReason.UNSUPPORTED_BUILTIN)


def _vars(tx, *obj):
    """`vars(obj)`: `obj.__dict__` (without an argument: the frame's locals, refused)."""
    if len(obj) != 1:
        unsupported("vars() without an argument", BreakReason.UNSUPPORTED_BUILTIN)
    return tx.realize(obj[0]).var_getattr(tx, "__dict__")


def _type_call(tx, cls, *args, **kwargs):
    """`type.__call__(cls, *args)`: `cls(*args)`."""
    return tx.realize(cls).call_function(tx, list(args), kwargs)


def _replayed(fn):
    """A call made for its effect (`warnings.warn`): recorded now, run by the entry after the
    graph (TraceResult.side_effects), never dropped. Its arguments must be reconstructible."""
    def handler(tx, *args, **kwargs):
        tx.output.side_effects.record_call(fn, (*args, *kwargs.values()), tuple(kwargs))
        return _c(None)
    return handler


def reordered_call(tx, fn: Any, args, kwargs) -> VariableTracker | None:
    """`fn(*args, **kwargs)` recorded and run by the entry after the graph, when `fn` is in
    `config.reorderable_logging_functions` and every argument is a tensor or a constant (None:
    not reorderable, the call goes on as usual)."""
    from ferrodyn import config
    from ferrodyn.variables.tensor import TensorVariable
    try:
        if fn not in config.reorderable_logging_functions:
            return None
    except TypeError:  # unhashable callable
        return None
    values = [tx.realize(a) for a in (*args, *kwargs.values())]
    for v in values:
        if not (isinstance(v, TensorVariable) or
                (isinstance(v, ConstantVariable) and is_constant_value(v.value))):
            return None
    tx.output.side_effects.record_call(fn, tuple(values), tuple(kwargs))
    return _c(None)


def _operator_binary(fn):
    return lambda tx, a, b: ops.binary_op(tx, fn, a, b)


def _operator_compare(fn):
    return lambda tx, a, b: ops.compare_op(tx, fn, a, b)


BUILTIN_HANDLERS: dict[Any, Callable] = {
    len: _len, isinstance: _isinstance, issubclass: _issubclass, range: _range,
    enumerate: _enumerate, zip: _zip, reversed: _reversed, min: _minmax(min),
    max: _minmax(max), abs: _abs, sum: _sum, any: _any, all: _all, getattr: _getattr,
    hasattr: _hasattr, setattr: _setattr, type: _type, tuple: _tuple, list: _list,
    dict: _dict, int: _scalar(int), float: _scalar(float), bool: _scalar(bool),
    str: _scalar(str), complex: _scalar(complex), round: _round, pow: _pow, iter: _iter,
    next: _next, callable: _callable, sorted: _sorted, map: _map, filter: _filter,
    super: _super, slice: _slice, repr: _scalar(repr), format: _scalar(format),
    print: _unsupported("print", BreakReason.UNSUPPORTED_CALL),
    id: _id, hash: _hash, vars: _vars,
    input: _unsupported("input", BreakReason.UNSUPPORTED_CALL),
    open: _unsupported("open", BreakReason.UNSUPPORTED_CALL),
    object.__setattr__: _object_setattr,
    object.__getattribute__: _object_getattribute,
    type.__call__: _type_call,
    tuple.__new__: _tuple_new,
    functools.reduce: _reduce,
    set: _set, frozenset: _frozenset, collections.OrderedDict: _ordered_dict,
    functools.partial: _partial,
    operator.getitem: lambda tx, a, b: tx.realize(a).getitem(tx, b),
    operator.setitem: lambda tx, a, b, c: _c(tx.realize(a).setitem(tx, b, c)),
    operator.delitem: lambda tx, a, b: _c(tx.realize(a).delitem(tx, b)),
    operator.index: _scalar(operator.index),
    operator.not_: lambda tx, a: _c(not tx.realize(a).truth(tx)),
    operator.truth: lambda tx, a: _c(tx.realize(a).truth(tx)),
    operator.is_: lambda tx, a, b: _c(ops.is_same(tx, a, b)),
    operator.is_not: lambda tx, a, b: _c(not ops.is_same(tx, a, b)),
    operator.contains: lambda tx, a, b: _c(tx.realize(a).contains(tx, tx.realize(b))),
    operator.neg: lambda tx, a: ops.unary_op(tx, operator.neg, a),
    operator.pos: lambda tx, a: ops.unary_op(tx, operator.pos, a),
    operator.invert: lambda tx, a: ops.unary_op(tx, operator.invert, a),
    operator.abs: _abs,
    warnings.warn: _replayed(warnings.warn),
}
BUILTIN_HANDLERS.update(dict_objects.HANDLERS)
BUILTIN_HANDLERS.update(functools_vars.HANDLERS)
BUILTIN_HANDLERS.update(inspect_vars.HANDLERS)
BUILTIN_HANDLERS.update(contextlib_vars.HANDLERS)
BUILTIN_HANDLERS.update(itertools_vars.HANDLERS)
BUILTIN_HANDLERS.update(namedtuple_vars.HANDLERS)
BUILTIN_HANDLERS.update(dunder_new.HANDLERS)
BUILTIN_HANDLERS.update(copy_protocol.HANDLERS)
BUILTIN_HANDLERS.update(exceptions.HANDLERS)
for _fn in ops.BINARY_FUNCTIONS:
    BUILTIN_HANDLERS.setdefault(_fn, _operator_binary(_fn))
for _fn in ops.COMPARE_FUNCTIONS:
    BUILTIN_HANDLERS.setdefault(_fn, _operator_compare(_fn))

# Functions without side effects that are folded when all arguments are constants.
FOLDABLE: frozenset = frozenset(
    {v for v in vars(math).values() if callable(v)}
    | {v for v in vars(operator).values() if callable(v)}
    | {builtins.divmod, builtins.pow, builtins.chr, builtins.ord, builtins.hash,
       builtins.bin, builtins.hex, builtins.oct, builtins.ascii}
    # interpreter settings read as limits (inspect.unwrap): not guarded, like torch's own
    | {sys.getrecursionlimit}
)

# FOLDABLE functions that never mutate an argument nor return one of its elements by identity,
# so they may fold on *copies* of constant lists (`math.prod(self.size)`, `math.hypot(*xs)`):
# each returns a new number made from the items.
FOLDABLE_ON_COPIES: frozenset = frozenset(v for v in vars(math).values() if callable(v))


def is_builtin_like(value: Any) -> bool:
    cls = type(value)
    if isinstance(getattr(cls, "__hash__", None), FunctionType) or \
            isinstance(getattr(cls, "__eq__", None), FunctionType):
        return False  # a user object: the lookup would run its __hash__/__eq__ at compile time
    try:
        return value in BUILTIN_HANDLERS or value in FOLDABLE
    except TypeError:
        return False


# Keyword arguments accepted by the modelled callables that have no introspectable signature
# (CPython's own parsing); None: any keyword. Those absent accept none.
_KWARGS_OK: dict[Any, frozenset | None] = {
    zip: frozenset({"strict"}), min: frozenset({"key", "default"}),
    max: frozenset({"key", "default"}), dict: None, int: frozenset({"base"}),
    str: frozenset({"object", "encoding", "errors"}), collections.OrderedDict: None,
    collections.defaultdict: None, collections.Counter: None,
    functools.partial: None, operator.methodcaller: None,
    **itertools_vars.KWARGS_OK,
}


@functools.lru_cache(maxsize=None)
def _signature(fn) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def bad_call_args(fn, args, kwargs) -> str | None:
    """Why CPython rejects calling `fn` with these argument *shapes* (a positional-only
    parameter passed by keyword, a missing or extra argument), or None. The handlers' own
    Python signatures are looser (`isinstance(obj=x, ...)` must raise, not fold)."""
    try:
        sig = _signature(fn)
    except TypeError:  # unhashable
        return None
    name = getattr(fn, "__name__", "function")
    if sig is not None:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            return f"{name}(): {e}"
        return None
    allowed = _KWARGS_OK.get(fn, frozenset())
    extra = None if allowed is None else sorted(set(kwargs) - allowed)
    return f"{name}() got an unexpected keyword argument {extra[0]!r}" if extra else None


@dataclass(frozen=True, eq=False)
class BuiltinVariable(VariableTracker):
    """A builtin function or type (`len`, `int`, `operator.add`, `math.sqrt`)."""

    fn: Any = None

    def python_type(self):
        return type(self.fn)

    def as_python_constant(self):
        return self.fn

    def identity(self):
        return ("obj", id(self.fn))

    def describe(self):
        return f"builtin {getattr(self.fn, '__name__', self.fn)}"

    def call_function(self, tx, args, kwargs):
        reordered = reordered_call(tx, self.fn, args, kwargs)
        if reordered is not None:
            return reordered
        handler = BUILTIN_HANDLERS.get(self.fn)
        if handler is not None:
            bad = bad_call_args(self.fn, args, kwargs)
            if bad is not None:  # eager raises CPython's TypeError: the frame runs it
                unsupported(f"TypeError: {bad}", BreakReason.EXCEPTION)
            try:
                return handler(tx, *args, **kwargs)
            except TypeError as e:
                if "positional argument" in str(e) or "keyword argument" in str(e):
                    unsupported(f"{self.describe()}: {e}", BreakReason.EXCEPTION)
                raise
        if isinstance(self.fn, type) and issubclass(self.fn, BaseException):
            from ferrodyn.variables import exceptions
            if not exceptions.can_make(self.fn):
                unsupported(f"creating exception {self.fn.__name__}", BreakReason.EXCEPTION)
            return exceptions.make(tx, self.fn, args, kwargs)
        if self.fn in FOLDABLE:
            consts = _items_consts if self.fn in FOLDABLE_ON_COPIES else _consts
            vals = consts(tx, args)
            kvals = consts(tx, list(kwargs.values()))
            if vals is None or kvals is None:
                symbolic = sym_int.sym_convert(tx, self.fn, args[0]) \
                    if len(args) == 1 and not kwargs else None
                if symbolic is not None:  # math.ceil(s / 2)
                    return symbolic
                unsupported(f"{self.describe()} with non-constant arguments",
                            BreakReason.UNSUPPORTED_BUILTIN)
            return wrap_constant(fold(self.fn, *vals, **dict(zip(kwargs, kvals))))
        unsupported(f"{self.describe()}", BreakReason.UNSUPPORTED_BUILTIN)

    def var_getattr(self, tx, name):
        if isinstance(self.fn, type):
            if name == "__setattr__" and self.fn is object:
                return BuiltinVariable(fn=object.__setattr__)
            attr = getattr(self.fn, name, None)
            if attr is not None and is_builtin_like(attr):
                return BuiltinVariable(fn=attr)
            if name in ("__name__", "__qualname__", "__module__"):
                return _c(getattr(self.fn, name))
            if isinstance(attr, (classmethod, staticmethod)) or callable(attr):
                return _BuiltinTypeMethod(owner=self.fn, name=name)
        if name in ("__name__", "__qualname__"):
            return _c(getattr(self.fn, name))
        unsupported(f"attribute {name!r} of {self.describe()}", BreakReason.UNSUPPORTED_BUILTIN)

    def has_attr(self, tx, name):
        return hasattr(self.fn, name)

    def getitem(self, tx, index):
        if not isinstance(self.fn, type):
            return super().getitem(tx, index)
        from ferrodyn.variables import typing_vars  # `list[int]`: a generic alias, folded
        return typing_vars.subscript(tx, self, index)

    def fx_arg(self, tx):
        dtype = _SCALAR_DTYPES.get(self.fn)  # `x.to(bool)`: torch's argument parser reads a
        if dtype is not None:  # Python scalar type as its dtype (float: float64, not the default)
            return dtype, dtype
        return super().fx_arg(tx)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        return OutConst(self.fn)


def _scalar_dtypes() -> dict:
    import torch
    return {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


_SCALAR_DTYPES = _scalar_dtypes()


@dataclass(frozen=True, eq=False)
class _BuiltinTypeMethod(VariableTracker):
    """`dict.fromkeys`, `str.join`, `tuple.__new__`...: folded on constants, else a method of
    the first argument (`list.append(xs, 1)`)."""

    owner: type = object
    name: str = ""

    def call_function(self, tx, args, kwargs):
        vals = _consts(tx, list(args) + list(kwargs.values()))
        if vals is not None:
            return wrap_constant(fold(getattr(self.owner, self.name), *vals[:len(args)],
                                      **dict(zip(kwargs, vals[len(args):]))))
        if not args:
            unsupported(f"{self.owner.__name__}.{self.name}()", BreakReason.UNSUPPORTED_BUILTIN)
        first = tx.realize(args[0])
        if not issubclass(first.python_type(), self.owner):
            unsupported(f"TypeError: {self.owner.__name__}.{self.name} on {first.describe()}",
                        BreakReason.EXCEPTION)
        protocol = SLOT_PROTOCOL.get(self.name)
        if protocol is not None and not kwargs:
            return protocol(tx, first, *args[1:])
        return first.call_method(tx, self.name, list(args[1:]), kwargs)


def _slot_result(fn):
    def handler(tx, obj, *args):
        res = fn(tx, obj, *args)
        return res if isinstance(res, VariableTracker) else _c(res)
    return handler


# Slot wrappers called through the type (`dict.__setitem__(d, k, v)`, `list.__len__(xs)`):
# the tracker protocol method that the slot stands for.
SLOT_PROTOCOL: dict[str, Callable] = {
    "__getitem__": _slot_result(lambda tx, o, k: o.getitem(tx, k)),
    "__setitem__": _slot_result(lambda tx, o, k, v: o.setitem(tx, k, v)),
    "__delitem__": _slot_result(lambda tx, o, k: o.delitem(tx, k)),
    "__len__": _slot_result(lambda tx, o: o.length(tx)),
    "__contains__": _slot_result(lambda tx, o, k: o.contains(tx, tx.realize(k))),
    "__iter__": _slot_result(lambda tx, o: o.iterator(tx)),
    "__bool__": _slot_result(lambda tx, o: o.truth(tx)),
}


@dataclass(frozen=True, eq=False)
class NoOpFunction(VariableTracker):
    name: str = ""

    def call_function(self, tx, args, kwargs):
        return _c(None)

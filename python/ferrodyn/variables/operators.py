"""Python operators between trackers: binary (and in-place), comparison, unary, identity.

Owns the opcode-symbol tables (`"+" -> operator.add`, `"+=" -> operator.iadd`, ...) and the
dispatch: a tensor operand makes a graph node; constants fold (in-place operators only on
immutable values; `n op= t` with a non-tensor `n` is `n op t`, as CPython falls back when the
type has no `__iop__`); tuples/lists concatenate and repeat; objects with Python dunder methods
inline them. Owns identity (`is`: by identity keys, never by equality of state; guarded by
ID_MATCH when it compares objects read through different paths, refused when it cannot be
known) and rich comparison of user objects (`__eq__`/`__ne__`, reflected first for a subclass,
NotImplemented falling back to identity for ==/!=). Does not own truthiness or indexing (each
tracker's `truth`/`getitem`).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.variables.base import NotConstant, VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable, fold, wrap_constant

BINARY_SYMBOLS: dict[str, Callable] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "<<": operator.lshift, ">>": operator.rshift, "&": operator.and_, "|": operator.or_,
    "^": operator.xor,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
    "@=": operator.imatmul, "<<=": operator.ilshift, ">>=": operator.irshift,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
}
BINARY_FUNCTIONS = frozenset(BINARY_SYMBOLS.values())
COMPARE_SYMBOLS: dict[str, Callable] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, ">=": operator.ge,
}
COMPARE_FUNCTIONS = frozenset(COMPARE_SYMBOLS.values())
_INPLACE_TO_BINARY = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod, operator.ipow: operator.pow, operator.imatmul: operator.matmul,
    operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
    operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor,
}
_DUNDERS = {
    operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
    operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
    operator.matmul: ("__matmul__", "__rmatmul__"),
    operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
    operator.pow: ("__pow__", "__rpow__"), operator.lshift: ("__lshift__", "__rlshift__"),
    operator.rshift: ("__rshift__", "__rrshift__"), operator.and_: ("__and__", "__rand__"),
    operator.or_: ("__or__", "__ror__"), operator.xor: ("__xor__", "__rxor__"),
}
# Kinds of tracker whose Python type has in-place methods (`list.__iadd__`, `set.__ior__`,
# `dict.__ior__`, tensors' `__iadd__`...); for every other builtin value `a op= b` is `a op b`.
_INPLACE_TYPES = (list, dict, set, __import__("collections").OrderedDict,
                  __import__("collections").defaultdict)


def _is_tensor(v) -> bool:
    from ferrodyn.variables.tensor import TensorVariable
    return isinstance(v, TensorVariable)


def _is_graph_value(v) -> bool:
    """A tensor or a symbolic int: operators on it are recorded in the graph."""
    from ferrodyn.variables.sym_int import SymIntVariable
    return _is_tensor(v) or isinstance(v, SymIntVariable)


def _numpy_operator(tx, fn: Callable, *operands: VariableTracker) -> VariableTracker | None:
    """An operator with an ndarray or numpy scalar operand (numpy_vars.py); None otherwise."""
    from ferrodyn.variables.numpy_vars import NdarrayVariable, NumpyConstVariable
    if not any(isinstance(v, (NdarrayVariable, NumpyConstVariable)) for v in operands):
        return None
    from ferrodyn.variables.numpy_vars import numpy_operator
    return numpy_operator(tx, fn, *operands)


def _const(v: VariableTracker) -> Any:
    return v.as_python_constant()


def _const_tuple_as_sequence(v: VariableTracker, other: VariableTracker) -> VariableTracker:
    from ferrodyn.variables.lists import ListVariable, TupleVariable
    if isinstance(v, ConstantVariable) and type(_const(v)) is tuple and \
            isinstance(other, (ListVariable, TupleVariable)):
        return TupleVariable(items=tuple(wrap_constant(x) for x in _const(v)))
    return v


def binary_op(tx, fn: Callable, a: VariableTracker, b: VariableTracker) -> VariableTracker:
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.lists import ListVariable, TupleVariable
    from ferrodyn.variables.tensor import record_op
    a, b = tx.realize(a), tx.realize(b)
    res = _numpy_operator(tx, fn, a, b)
    if res is not None:
        return res
    if fn in _INPLACE_TO_BINARY and not _is_tensor(a):
        fn = _inplace_fallback(tx, fn, a, b)
        if isinstance(fn, VariableTracker):
            return fn
    if _is_graph_value(a) or _is_graph_value(b):  # a tensor or a SymInt: a graph op
        return record_op(tx, "call_function", fn, [a, b], {})
    if a.is_python_constant() and b.is_python_constant() and \
            isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return wrap_constant(fold(fn, _const(a), _const(b)))
    if fn is operator.mod and isinstance(a, ConstantVariable) and \
            isinstance(a.value, (str, bytes)):
        # `"%s %d" % args` with a tuple tracker whose items were not looked at yet
        from ferrodyn.variables.lists import TupleVariable
        if isinstance(b, TupleVariable):
            try:
                args = tuple(_const_immutable(tx.realize(i)) for i in b.unpack(tx))
            except NotConstant:
                args = None
            if args is not None:
                return wrap_constant(fold(fn, a.value, args))
    from ferrodyn.variables.dicts import DictViewVariable
    if isinstance(a, DictViewVariable) or isinstance(b, DictViewVariable):
        from ferrodyn.variables.dict_views import view_binary
        res = view_binary(tx, fn, a, b)  # `d1.keys() | d2.keys()`: a set
        if res is not None:
            return res
    from ferrodyn.variables.sets import SetVariable, set_binary
    if isinstance(a, SetVariable) or isinstance(b, SetVariable):
        res = set_binary(tx, fn, a, b)
        if res is not None:
            return res
    # a constant tuple (`()` or `(1, 2)` from LOAD_CONST) meeting a sequence tracker behaves as
    # the tuple of its constants: `acc = (); acc = acc + (x,)`
    a, b = _const_tuple_as_sequence(a, b), _const_tuple_as_sequence(b, a)
    base = _INPLACE_TO_BINARY.get(fn, fn)
    inplace = fn is not base
    if isinstance(a, ListVariable) and inplace and base is operator.add:
        from ferrodyn.variables.lists import _extend
        _extend(tx, a, b)
        return a
    if isinstance(a, (ListVariable, TupleVariable)):
        seq_type = ListVariable if isinstance(a, ListVariable) else TupleVariable
        if base is operator.add and type(b) is type(a) or \
                (base is operator.add and isinstance(b, TupleVariable) and seq_type is TupleVariable):
            items = a.unpack(tx) + b.unpack(tx)
            return ListVariable.new(items) if seq_type is ListVariable else \
                TupleVariable(items=tuple(items))
        if base is operator.mul and b.is_python_constant():
            items = a.unpack(tx) * _const(b)
            if inplace and seq_type is ListVariable:
                a.mutable()[:] = items
                return a
            return ListVariable.new(items) if seq_type is ListVariable else \
                TupleVariable(items=tuple(items))
    if isinstance(b, (ListVariable, TupleVariable)) and base is operator.mul and \
            a.is_python_constant():
        return binary_op(tx, fn, b, a)
    if isinstance(a, DictVariable) and base is operator.or_ and \
            (inplace or isinstance(b, DictVariable)):
        from ferrodyn.variables.dicts import dict_or
        return dict_or(tx, a, b, inplace)
    if a.is_python_constant() and b.is_python_constant():
        read = _const_immutable if fn in _INPLACE_TO_BINARY else _const  # never mutate a copy
        try:
            return wrap_constant(fold(fn, read(a), read(b)))
        except NotConstant:
            pass
    dunder = _DUNDERS.get(base)
    if dunder is not None:
        from ferrodyn.variables.user_objects import ObjectLike
        if isinstance(a, ObjectLike):
            meth = a._dunder(tx, dunder[0])
            if meth is not None:
                return tx.realize(meth).call_function(tx, [b], {})
        if isinstance(b, ObjectLike):
            meth = b._dunder(tx, dunder[1])
            if meth is not None:
                return tx.realize(meth).call_function(tx, [a], {})
    unsupported(f"operator {fn.__name__} on {a.describe()} and {b.describe()}",
                BreakReason.UNSUPPORTED_TYPE)


def _inplace_fallback(tx, fn: Callable, a: VariableTracker, b: VariableTracker):
    """`a op= b` as CPython runs it when `a` is not a tensor: `type(a).__iop__` if it has one
    (a user method is inlined; NotImplemented falls through), else the binary operator.
    Returns the operator to apply, or the result of an inlined user method."""
    from ferrodyn.variables.user_objects import ObjectLike
    base = _INPLACE_TO_BINARY[fn]
    if isinstance(a, ObjectLike):
        meth = a._dunder(tx, "__i" + _DUNDERS[base][0][2:])
        if meth is not None:
            res = tx.realize(tx.realize(meth).call_function(tx, [b], {}))
            if not _is_not_implemented(res):
                return res
        return base
    try:
        pytype = a.python_type()
    except Unsupported:
        return fn  # not decidable here: the handlers below keep `fn` and refuse or model it
    if pytype in _INPLACE_TYPES:
        return fn
    if any("__i" + _DUNDERS[base][0][2:] in vars(k) for k in pytype.__mro__):
        unsupported(f"in-place {fn.__name__} on {a.describe()}", BreakReason.UNSUPPORTED_TYPE)
    return base


def compare_op(tx, fn: Callable, a: VariableTracker, b: VariableTracker) -> VariableTracker:
    from ferrodyn.variables.tensor import record_op
    a, b = tx.realize(a), tx.realize(b)
    res = _numpy_operator(tx, fn, a, b)
    if res is not None:
        return res
    if _is_graph_value(a) or _is_graph_value(b):
        return record_op(tx, "call_function", fn, [a, b], {})
    rich = rich_compare(tx, fn, a, b)
    if rich is not None:
        return rich
    from ferrodyn.variables.dicts import DictViewVariable
    if fn in (operator.eq, operator.ne) and (isinstance(a, DictViewVariable) or
                                             isinstance(b, DictViewVariable)):
        eq = values_equal(tx, a, b)  # a keys view compares with a set as a set
        return ConstantVariable(value=eq if fn is operator.eq else not eq)
    from ferrodyn.variables.sets import SetVariable, set_compare
    if isinstance(a, SetVariable) or isinstance(b, SetVariable):
        res = set_compare(tx, fn, a, b)
        if res is not None:
            return res
    if fn in (operator.eq, operator.ne):
        eq = values_equal(tx, a, b)
        return ConstantVariable(value=eq if fn is operator.eq else not eq)
    try:
        return ConstantVariable(value=fold(fn, _const(a), _const(b)))  # pure: copies are fine
    except NotConstant:
        unsupported(f"comparison {fn.__name__} of {a.describe()} and {b.describe()}",
                    BreakReason.UNSUPPORTED_TYPE)


def _const_immutable(v: VariableTracker) -> Any:
    """The constant value of `v`, only when it is an immutable value (never a copy of a list,
    dict or set that a folded function could mutate or compare by identity)."""
    from ferrodyn.variables.constant import is_constant_value
    value = v.as_python_constant()
    if not is_constant_value(value):
        raise NotConstant(v)
    return value


# ---- rich comparison of user objects (CPython's do_richcompare) ------------------------------

_REFLECTED = {operator.eq: "__eq__", operator.ne: "__ne__", operator.lt: "__gt__",
              operator.gt: "__lt__", operator.le: "__ge__", operator.ge: "__le__"}
_FORWARD = {operator.eq: "__eq__", operator.ne: "__ne__", operator.lt: "__lt__",
            operator.gt: "__gt__", operator.le: "__le__", operator.ge: "__ge__"}


def _user_type(v: VariableTracker) -> type | None:
    """The class of `v` when `v` is an instance of user code whose comparisons are its
    class's Python methods (None for the builtin kinds, which compare by value)."""
    from ferrodyn.variables.user_objects import ObjectLike
    if not isinstance(v, ObjectLike):
        return None
    cls = v.python_type()
    for klass in cls.__mro__[1:-1]:
        if klass.__module__ == "builtins":  # a subclass of list, dict, int...: builtin __eq__
            unsupported(f"comparison of a {cls.__name__} object (a subclass of "
                        f"{klass.__name__})", BreakReason.UNSUPPORTED_TYPE)
    return cls


def _call_slot(tx, obj: VariableTracker, name: str, other: VariableTracker):
    """`type(obj).name(obj, other)`, or the result of object's default for that slot."""
    meth = obj._dunder(tx, name)
    if meth is not None:
        return tx.realize(tx.realize(meth).call_function(tx, [other], {}))
    if name == "__eq__":
        return ConstantVariable(value=True if is_same(tx, obj, other) else NotImplemented)
    if name == "__ne__":  # object.__ne__: the inverse of type(obj).__eq__, if implemented
        eq = _call_slot(tx, obj, "__eq__", other)
        if _is_not_implemented(eq):
            return eq
        return ConstantVariable(value=not eq.truth(tx))
    return ConstantVariable(value=NotImplemented)


def _is_not_implemented(v: VariableTracker) -> bool:
    return getattr(v, "value", None) is NotImplemented


def rich_compare(tx, fn: Callable, a: VariableTracker, b: VariableTracker):
    """`a <op> b` when either side is a user object: the forward method, then the reflected
    one (first when b's class is a proper subclass overriding it), then the identity default
    of == and !=. None when neither side is a user object."""
    ta, tb = _user_type(a), _user_type(b)
    if ta is None and tb is None:
        return None
    if fn not in _FORWARD:
        return None
    if ta is not None and tb is not None and tb is not ta and issubclass(tb, ta) and \
            b._dunder(tx, _REFLECTED[fn]) is not None:
        order = [(b, _REFLECTED[fn], a), (a, _FORWARD[fn], b)]
    else:
        order = [(a, _FORWARD[fn], b), (b, _REFLECTED[fn], a)]
    for obj, name, other in order:
        if _user_type(obj) is None:
            # a builtin value's comparison with an instance of an unrelated user class
            # returns NotImplemented
            continue
        res = _call_slot(tx, obj, name, other)
        if not _is_not_implemented(res):
            return res
    if fn is operator.eq:
        return ConstantVariable(value=is_same(tx, a, b))
    if fn is operator.ne:
        return ConstantVariable(value=not is_same(tx, a, b))
    unsupported(f"TypeError: {fn.__name__} not supported between {a.describe()} and "
                f"{b.describe()}", BreakReason.EXCEPTION)


def values_equal(tx, a: VariableTracker, b: VariableTracker) -> bool:
    """`bool(a == b)` for non-tensor trackers, decided at trace time."""
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.functions import BoundMethodVariable, OpaqueVariable
    from ferrodyn.variables.lists import _SequenceBase
    a, b = tx.realize(a), tx.realize(b)
    from ferrodyn.variables.dicts import DictViewVariable, dict_view_equal
    if isinstance(a, DictViewVariable) or isinstance(b, DictViewVariable):
        return dict_view_equal(tx, a, b)
    from ferrodyn.variables.dict_views import mappingproxy_equal
    proxied = mappingproxy_equal(tx, a, b)  # a mappingproxy compares as its mapping
    if proxied is not None:
        return proxied
    if _is_tensor(a) or _is_tensor(b):
        unsupported("== between a tensor and a value as a Python bool", BreakReason.DATA_DEPENDENT)
    if _is_graph_value(a) or _is_graph_value(b):  # a SymInt: decided with a ShapeEnv guard
        try:
            ea, eb = (v.example if _is_graph_value(v) else v.as_python_constant() for v in (a, b))
        except NotConstant:
            return False  # an int is never equal to a list, object...
        from ferrodyn.variables.sym_int import data_dependent_breaks
        with data_dependent_breaks("=="):
            return bool(ea == eb)
    rich = rich_compare(tx, operator.eq, a, b)
    if rich is not None:
        return tx.realize(rich).truth(tx)
    for v in (a, b):
        if isinstance(v, OpaqueVariable) and type(v.value).__eq__ is not object.__eq__:
            unsupported(f"== on {v.describe()}", BreakReason.UNSUPPORTED_TYPE)
    if isinstance(a, BoundMethodVariable) or isinstance(b, BoundMethodVariable):
        # method == method: same __self__ (identity) and equal __func__
        if not (isinstance(a, BoundMethodVariable) and isinstance(b, BoundMethodVariable)):
            return False
        from ferrodyn.variables.functions import MethodOf
        if isinstance(a.func, MethodOf) or isinstance(b.func, MethodOf):
            return isinstance(a.func, MethodOf) and isinstance(b.func, MethodOf) and \
                a.func.name == b.func.name and is_same(tx, a.obj, b.obj)
        return is_same(tx, a.obj, b.obj) and values_equal(tx, a.func, b.func)
    if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return bool(fold(operator.eq, a.value, b.value))
    if isinstance(a, _SequenceBase) and isinstance(b, _SequenceBase):
        if not issubclass(a.python_type(), tuple) == issubclass(b.python_type(), tuple):
            return False
        ia, ib = a.unpack(tx), b.unpack(tx)
        return len(ia) == len(ib) and all(
            is_same(tx, x, y) or values_equal(tx, x, y) for x, y in zip(ia, ib))
    if isinstance(a, ConstantVariable) and isinstance(b, _SequenceBase) or \
            isinstance(b, ConstantVariable) and isinstance(a, _SequenceBase):
        const, seq = (a, b) if isinstance(a, ConstantVariable) else (b, a)
        if isinstance(const.value, tuple) and issubclass(seq.python_type(), tuple):
            return values_equal(tx, TupleVariableFrom(const.value), seq)
        return False
    from ferrodyn.variables.sets import SetVariable
    if isinstance(a, SetVariable) or isinstance(b, SetVariable):
        other = b if isinstance(a, SetVariable) else a
        if not issubclass(other.python_type(), (set, frozenset)):
            return False
        from ferrodyn.variables.sets import set_compare
        return set_compare(tx, operator.eq, a, b).value
    if isinstance(a, DictVariable) and isinstance(b, DictVariable):
        ka, kb = a.state.items, b.state.items
        return ka.keys() == kb.keys() and all(
            is_same(tx, ka[k], kb[k]) or values_equal(tx, ka[k], kb[k]) for k in ka)
    try:
        return bool(fold(operator.eq, _const(a), _const(b)))  # pure: copies are fine
    except NotConstant:
        pass
    return is_same(tx, a, b)


def TupleVariableFrom(value: tuple) -> VariableTracker:
    from ferrodyn.variables.lists import TupleVariable
    return TupleVariable(items=tuple(ConstantVariable(value=v) for v in value))


def _guard_identity(tx, v: VariableTracker) -> None:
    """`is` between two objects read from the frame depends on which objects they are."""
    from ferrodyn.guard_spec import GuardKind
    value = getattr(v, "value", None)
    if v.source is not None and value is not None:
        tx.output.install_guard(v.source, GuardKind.ID_MATCH, value)


def is_same(tx, a: VariableTracker, b: VariableTracker) -> bool:
    """`a is b` at trace time. Identity keys are tuples `("obj", id)` for objects the tracker
    holds (compared by value) or a state object (compared by `is`: the state dataclasses
    compare by contents, which is equality, not identity)."""
    a, b = tx.realize(a), tx.realize(b)
    if a is b:
        return True
    if (a.source is not None or b.source is not None) and not \
            (isinstance(a, ConstantVariable) or isinstance(b, ConstantVariable)):
        tx.output.side_effects.identity_sensitive = True  # the answer is guarded (aliasing)
    if _is_tensor(a) and _is_tensor(b) and a.node is not b.node and a.example is b.example:
        unsupported("`is` between two inputs that are the same tensor (aliasing is not guarded)",
                    BreakReason.OTHER)
    if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return a.value is b.value
    if isinstance(a, ConstantVariable) or isinstance(b, ConstantVariable):
        const = a if isinstance(a, ConstantVariable) else b
        other = b if const is a else a
        try:
            return const.value is _const_immutable(other)
        except NotConstant:
            return False  # a constant is never a tensor, list, object... tracked elsewhere
    ia, ib = a.identity(), b.identity()
    if isinstance(ia, tuple) and isinstance(ib, tuple):
        same = ia == ib
        if a.source is not None and b.source is not None and a.source != b.source:
            _guard_identity(tx, a)
            _guard_identity(tx, b)
        return same
    if ia is ib:
        return True
    if a.source is not None and b.source is not None and not _is_tensor(a):
        # two trackers built from different frame paths may stand for one object
        unsupported(f"`is` between {a.describe()} and {b.describe()} read through different "
                    f"paths", BreakReason.OTHER)
    return False


def unary_op(tx, fn: Callable, a: VariableTracker) -> VariableTracker:
    from ferrodyn.variables.tensor import record_op
    a = tx.realize(a)
    res = _numpy_operator(tx, fn, a)
    if res is not None:
        return res
    if _is_graph_value(a):
        return record_op(tx, "call_function", fn, [a], {})
    if a.is_python_constant():
        return wrap_constant(fold(fn, _const(a)))
    unsupported(f"unary {fn.__name__} on {a.describe()}", BreakReason.UNSUPPORTED_TYPE)

"""Python operators between trackers: binary (and in-place), comparison, unary, identity.

Owns the opcode-symbol tables (`"+" -> operator.add`, `"+=" -> operator.iadd`, ...) and the
dispatch: a tensor operand makes a graph node; constants fold; tuples/lists concatenate and
repeat; objects with Python dunder methods inline them. Does not own truthiness or indexing
(each tracker's `truth`/`getitem`).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

from ferrodyn.exc import BreakReason
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
}


def _is_tensor(v) -> bool:
    from ferrodyn.variables.tensor import TensorVariable
    return isinstance(v, TensorVariable)


def _is_graph_value(v) -> bool:
    """A tensor or a symbolic int: operators on it are recorded in the graph."""
    from ferrodyn.variables.sym_int import SymIntVariable
    return _is_tensor(v) or isinstance(v, SymIntVariable)


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
    if _is_graph_value(a) or _is_graph_value(b):
        return record_op(tx, "call_function", _INPLACE_TO_BINARY.get(fn, fn) if not (
            _is_tensor(a)) else fn, [a, b], {})
    if a.is_python_constant() and b.is_python_constant() and \
            isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return wrap_constant(fold(fn, _const(a), _const(b)))
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
    if isinstance(a, DictVariable) and isinstance(b, DictVariable) and base is operator.or_:
        merged = dict(a.state.items)
        merged.update(b.state.items)
        if inplace:
            a.mutable().update(b.state.items)
            return a
        return DictVariable.new(merged, a.state.cls)
    if a.is_python_constant() and b.is_python_constant():
        try:
            return wrap_constant(fold(fn, _const(a), _const(b)))
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


def compare_op(tx, fn: Callable, a: VariableTracker, b: VariableTracker) -> VariableTracker:
    from ferrodyn.variables.tensor import record_op
    a, b = tx.realize(a), tx.realize(b)
    if _is_graph_value(a) or _is_graph_value(b):
        return record_op(tx, "call_function", fn, [a, b], {})
    if fn in (operator.eq, operator.ne):
        eq = values_equal(tx, a, b)
        return ConstantVariable(value=eq if fn is operator.eq else not eq)
    try:
        return ConstantVariable(value=fold(fn, _const(a), _const(b)))
    except NotConstant:
        unsupported(f"comparison {fn.__name__} of {a.describe()} and {b.describe()}",
                    BreakReason.UNSUPPORTED_TYPE)


def values_equal(tx, a: VariableTracker, b: VariableTracker) -> bool:
    """`a == b` for non-tensor trackers, decided at trace time."""
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.lists import _SequenceBase
    a, b = tx.realize(a), tx.realize(b)
    if _is_tensor(a) or _is_tensor(b):
        unsupported("== between a tensor and a value as a Python bool", BreakReason.DATA_DEPENDENT)
    if _is_graph_value(a) or _is_graph_value(b):  # a SymInt: decided with a ShapeEnv guard
        try:
            ea, eb = (v.example if _is_graph_value(v) else v.as_python_constant() for v in (a, b))
        except NotConstant:
            return False  # an int is never equal to a list, object...
        return bool(ea == eb)
    if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return bool(fold(operator.eq, a.value, b.value))
    if isinstance(a, _SequenceBase) and isinstance(b, _SequenceBase):
        if not issubclass(a.python_type(), tuple) == issubclass(b.python_type(), tuple):
            return False
        ia, ib = a.unpack(tx), b.unpack(tx)
        return len(ia) == len(ib) and all(values_equal(tx, x, y) for x, y in zip(ia, ib))
    if isinstance(a, ConstantVariable) and isinstance(b, _SequenceBase) or \
            isinstance(b, ConstantVariable) and isinstance(a, _SequenceBase):
        const, seq = (a, b) if isinstance(a, ConstantVariable) else (b, a)
        if isinstance(const.value, tuple) and issubclass(seq.python_type(), tuple):
            return values_equal(tx, TupleVariableFrom(const.value), seq)
        return False
    from ferrodyn.variables.sets import SetVariable, elements
    if isinstance(a, SetVariable) or isinstance(b, SetVariable):
        other = b if isinstance(a, SetVariable) else a
        if not issubclass(other.python_type(), (set, frozenset)):
            return False
        return elements(tx, a) == elements(tx, b)
    if isinstance(a, DictVariable) and isinstance(b, DictVariable):
        ka, kb = a.state.items, b.state.items
        return ka.keys() == kb.keys() and all(values_equal(tx, ka[k], kb[k]) for k in ka)
    if a.is_python_constant() and b.is_python_constant():
        return bool(fold(operator.eq, _const(a), _const(b)))
    return is_same(tx, a, b)


def TupleVariableFrom(value: tuple) -> VariableTracker:
    from ferrodyn.variables.lists import TupleVariable
    return TupleVariable(items=tuple(ConstantVariable(value=v) for v in value))


def is_same(tx, a: VariableTracker, b: VariableTracker) -> bool:
    """`a is b` at trace time."""
    a, b = tx.realize(a), tx.realize(b)
    if _is_tensor(a) and _is_tensor(b) and a.node is not b.node and a.example is b.example:
        unsupported("`is` between two inputs that are the same tensor (aliasing is not guarded)",
                    BreakReason.OTHER)
    if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return a.value is b.value
    if isinstance(a, ConstantVariable) or isinstance(b, ConstantVariable):
        const = a if isinstance(a, ConstantVariable) else b
        other = b if const is a else a
        if other.is_python_constant():
            return const.value is other.as_python_constant()
        return False  # a constant is never a tensor, list, object... tracked elsewhere
    return a.identity() == b.identity()


def unary_op(tx, fn: Callable, a: VariableTracker) -> VariableTracker:
    from ferrodyn.variables.tensor import record_op
    a = tx.realize(a)
    if _is_graph_value(a):
        return record_op(tx, "call_function", fn, [a], {})
    if a.is_python_constant():
        return wrap_constant(fold(fn, _const(a)))
    unsupported(f"unary {fn.__name__} on {a.describe()}", BreakReason.UNSUPPORTED_TYPE)

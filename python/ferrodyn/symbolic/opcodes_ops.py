"""Opcode handlers: operators, subscripts and string formatting (BINARY_OP, COMPARE_OP,
IS_OP, CONTAINS_OP, UNARY_*, BINARY_SUBSCR/SLICE, STORE_SUBSCR/SLICE, DELETE_SUBSCR, GET_LEN,
FORMAT_VALUE, BUILD_STRING, CALL_INTRINSIC_1). The semantics live in variables/operators.py
and in each tracker's getitem/setitem. 3.13's COMPARE_OP (bool coercion bit) and its split
FORMAT_VALUE (CONVERT_VALUE, FORMAT_SIMPLE, FORMAT_WITH_SPEC) are in opcodes_313.py, on the
helpers `compare` and `format_constant` here."""

from __future__ import annotations

import operator

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.registry import opcode
from ferrodyn.variables import operators as ops
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable, fold


@opcode()
def BINARY_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    fn = ops.BINARY_SYMBOLS.get(inst.argrepr)
    if fn is None:
        unsupported(f"binary operator {inst.argrepr}", BreakReason.UNSUPPORTED_OPCODE)
    tx.push(ops.binary_op(tx, fn, a, b))


def compare(tx, inst):
    """Pop two operands and return the tracker of their comparison (`dis` decodes the operator
    into `argval` on every version)."""
    b = tx.pop()
    a = tx.pop()
    symbol = inst.argval if isinstance(inst.argval, str) else inst.argrepr
    fn = ops.COMPARE_SYMBOLS.get(symbol)
    if fn is None:
        unsupported(f"comparison {symbol}", BreakReason.UNSUPPORTED_OPCODE)
    return ops.compare_op(tx, fn, a, b)


@opcode(until=(3, 12))
def COMPARE_OP(tx, inst):
    tx.push(compare(tx, inst))


@opcode()
def IS_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    same = ops.is_same(tx, a, b)
    tx.push(ConstantVariable(value=(not same) if inst.arg else same))


@opcode()
def CONTAINS_OP(tx, inst):
    container = tx.pop()
    item = tx.pop()
    found = tx.realize(container).contains(tx, tx.realize(item))
    tx.push(ConstantVariable(value=(not found) if inst.arg else found))


@opcode()
def UNARY_NEGATIVE(tx, inst):
    tx.push(ops.unary_op(tx, operator.neg, tx.pop()))


@opcode(until=(3, 11))
def UNARY_POSITIVE(tx, inst):
    tx.push(ops.unary_op(tx, operator.pos, tx.pop()))


@opcode()
def UNARY_INVERT(tx, inst):
    tx.push(ops.unary_op(tx, operator.invert, tx.pop()))


@opcode()
def UNARY_NOT(tx, inst):
    tx.push(ConstantVariable(value=not tx.pop().truth(tx)))


@opcode()
def BINARY_SUBSCR(tx, inst):
    index = tx.pop()
    obj = tx.pop()
    tx.push(obj.getitem(tx, index))


def _slice_of(tx, start, stop):
    parts = [tx.realize(start), tx.realize(stop)]
    if not all(p.is_python_constant() for p in parts):
        from ferrodyn.variables.sym_int import symbolic_slice
        return symbolic_slice(parts)
    return ConstantVariable(value=slice(*(p.as_python_constant() for p in parts)))


@opcode(since=(3, 12))
def BINARY_SLICE(tx, inst):
    stop = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    tx.push(obj.getitem(tx, _slice_of(tx, start, stop)))


@opcode()
def STORE_SUBSCR(tx, inst):
    index = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    obj.setitem(tx, index, value)


@opcode(since=(3, 12))
def STORE_SLICE(tx, inst):
    stop = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    obj.setitem(tx, _slice_of(tx, start, stop), value)


@opcode()
def DELETE_SUBSCR(tx, inst):
    index = tx.pop()
    obj = tx.pop()
    obj.delitem(tx, index)


@opcode()
def GET_LEN(tx, inst):
    tx.push(ConstantVariable(value=tx.peek().length(tx)))


CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


def format_constant(tx, value, conv, spec: str | None):
    """An f-string part: `conv` (str/repr/ascii or None) then, unless `spec` is None,
    `format(v, spec)`, folded on a constant (anything else is refused; a SymInt is
    specialised under a shape guard, as torch)."""
    from ferrodyn.variables.sym_int import concrete
    from ferrodyn.variables.exceptions import ExceptionVariable
    value = concrete(tx, value)
    if isinstance(value, ExceptionVariable) and value.const_value(tx) is not None:
        v = value.const_value(tx)  # a builtin-formatted exception with constant args
    elif not value.is_python_constant():
        unsupported(f"f-string of {value.describe()}", BreakReason.UNSUPPORTED_TYPE)
    else:
        v = value.as_python_constant()
    if conv is not None:
        v = fold(conv, v)
    if spec is not None:
        v = fold(format, v, spec)
    return ConstantVariable(value=v)


@opcode(until=(3, 12))
def FORMAT_VALUE(tx, inst):
    spec = tx.pop().as_python_constant() if inst.arg & 4 else ""
    tx.push(format_constant(tx, tx.pop(), CONVERSIONS[inst.arg & 3], spec))


@opcode()
def BUILD_STRING(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(ConstantVariable(value="".join(p.as_python_constant() for p in parts)))


_INTRINSICS_1 = {
    "INTRINSIC_UNARY_POSITIVE": lambda tx, v: ops.unary_op(tx, operator.pos, v),
    "INTRINSIC_LIST_TO_TUPLE": lambda tx, v: __import__(
        "ferrodyn.variables.lists", fromlist=["TupleVariable"]).TupleVariable(
            items=tuple(v.unpack(tx))),
    "INTRINSIC_STOPITERATION_ERROR": lambda tx, v: __import__(
        "ferrodyn.variables.generators", fromlist=["x"]).stopiteration_error(tx, v),
}


@opcode(since=(3, 12))
def CALL_INTRINSIC_1(tx, inst):
    fn = _INTRINSICS_1.get(inst.argrepr)
    if fn is None:
        unsupported(f"CALL_INTRINSIC_1 {inst.argrepr}", BreakReason.UNSUPPORTED_OPCODE)
    tx.push(fn(tx, tx.pop()))

"""Opcode handlers: building and unpacking containers (BUILD_TUPLE/LIST/MAP/CONST_KEY_MAP/
SLICE, LIST_APPEND/EXTEND/TO_TUPLE, MAP_ADD, DICT_UPDATE/MERGE, UNPACK_SEQUENCE/EX)."""

from __future__ import annotations

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.registry import opcode
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.dicts import DictVariable, dict_key
from ferrodyn.variables.lists import ListVariable, TupleVariable


@opcode()
def BUILD_TUPLE(tx, inst):
    tx.push(TupleVariable(items=tuple(tx.popn(inst.arg))))


@opcode()
def BUILD_LIST(tx, inst):
    tx.push(ListVariable.new(tx.popn(inst.arg)))


@opcode()
def BUILD_MAP(tx, inst):
    flat = tx.popn(2 * inst.arg)
    tx.push(DictVariable.new({dict_key(tx, flat[i]): flat[i + 1]
                              for i in range(0, len(flat), 2)}))


@opcode()
def BUILD_CONST_KEY_MAP(tx, inst):
    keys = tx.pop().as_python_constant()
    values = tx.popn(inst.arg)
    tx.push(DictVariable.new(dict(zip(keys, values))))


@opcode()
def BUILD_SLICE(tx, inst):
    parts = [tx.realize(p) for p in tx.popn(inst.arg)]
    if not all(p.is_python_constant() for p in parts):
        from ferrodyn.variables.sym_int import symbolic_slice
        tx.push(symbolic_slice(parts))
        return
    tx.push(ConstantVariable(value=slice(*(p.as_python_constant() for p in parts))))


@opcode()
def LIST_APPEND(tx, inst):
    v = tx.pop()
    tx.peek(inst.arg).mutable().append(v)


@opcode()
def LIST_EXTEND(tx, inst):
    v = tx.pop()
    tx.peek(inst.arg).mutable().extend(tx.realize(v).iterator(tx).unpack(tx))


@opcode(until=(3, 11))
def LIST_TO_TUPLE(tx, inst):
    tx.push(TupleVariable(items=tuple(tx.pop().unpack(tx))))


@opcode()
def MAP_ADD(tx, inst):
    value = tx.pop()
    key = tx.pop()
    tx.peek(inst.arg).mutable()[dict_key(tx, key)] = value


def _merge(tx, inst, check_dupes: bool):
    other = tx.realize(tx.pop())
    target = tx.peek(inst.arg)
    if not isinstance(other, DictVariable):
        unsupported(f"** of {other.describe()}", BreakReason.UNSUPPORTED_TYPE)
    items = target.mutable()
    for k, v in other.state.items.items():
        if check_dupes and k in items:
            unsupported(f"got multiple values for keyword argument {k!r}", BreakReason.EXCEPTION)
        items[k] = v


@opcode()
def DICT_UPDATE(tx, inst):
    _merge(tx, inst, False)


@opcode()
def DICT_MERGE(tx, inst):
    _merge(tx, inst, True)


def _unpack_items(tx, seq):
    return tx.realize(seq).iterator(tx).unpack(tx)


@opcode()
def UNPACK_SEQUENCE(tx, inst):
    items = _unpack_items(tx, tx.pop())
    if len(items) != inst.arg:
        unsupported(f"unpacking {len(items)} values into {inst.arg}", BreakReason.EXCEPTION)
    for item in reversed(items):
        tx.push(item)


@opcode()
def UNPACK_EX(tx, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = _unpack_items(tx, tx.pop())
    if len(items) < before + after:
        unsupported("not enough values to unpack", BreakReason.EXCEPTION)
    middle = ListVariable.new(items[before:len(items) - after])
    out = items[:before] + [middle] + items[len(items) - after:]
    for item in reversed(out):
        tx.push(item)


@opcode()
def BUILD_SET(tx, inst):
    from ferrodyn.variables.sets import SetVariable, key_of
    tx.push(SetVariable.new([key_of(tx, v) for v in tx.popn(inst.arg)]))


@opcode()
def SET_ADD(tx, inst):
    from ferrodyn.variables.sets import key_of
    v = tx.pop()
    tx.realize(tx.peek(inst.arg)).add_keys(tx, [key_of(tx, v)])


@opcode()
def SET_UPDATE(tx, inst):
    from ferrodyn.variables.sets import set_update
    v = tx.pop()
    set_update(tx, tx.realize(tx.peek(inst.arg)), v)

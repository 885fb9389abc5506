"""Opcode handlers new in, or changed by, CPython 3.13 (registered `since=(3, 13)`).

Owns: CALL_KW (keyword names as a tuple on the stack instead of KW_NAMES), TO_BOOL (explicit
truth before conditional jumps and `not`), the local-variable superinstructions
(LOAD_FAST_LOAD_FAST, STORE_FAST_STORE_FAST, STORE_FAST_LOAD_FAST), MAKE_FUNCTION without flags
plus SET_FUNCTION_ATTRIBUTE, COMPARE_OP with its bool-coercion bit, and FORMAT_VALUE's split
into CONVERT_VALUE, FORMAT_SIMPLE and FORMAT_WITH_SPEC. Each reuses the helper of the handler
it replaces, so 3.13 computes exactly what 3.12 did for the same source.

Does not own: the call-stack layout (call_stack.py: 3.13 keeps NULL/self above the callable),
FOR_ITER's exit (instructions.py), or 3.13's LOAD_FAST of a cell slot (LOAD_CLOSURE's
replacement, opcodes_load_store.load_fast_value).
"""

from __future__ import annotations

import dataclasses

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.call_stack import pop_call
from ferrodyn.symbolic.opcodes_call import call_with_names
from ferrodyn.symbolic.opcodes_load_store import load_fast_value, store_fast_value
from ferrodyn.symbolic.opcodes_ops import CONVERSIONS, compare, format_constant
from ferrodyn.symbolic.registry import opcode
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables.dicts import DictVariable
from ferrodyn.variables.functions import NestedFunctionVariable

V313 = (3, 13)


@opcode(since=V313)
def CALL_KW(tx, inst):
    """`callable self|NULL args... kwnames`: the last `len(kwnames)` arguments by keyword."""
    names = tx.pop().as_python_constant()
    if type(names) is not tuple or not all(type(n) is str for n in names):
        unsupported(f"CALL_KW keyword names {names!r}", BreakReason.UNSUPPORTED_OPCODE)
    fn, args = pop_call(tx, inst.arg)
    call_with_names(tx, fn, args, names)


@opcode(since=V313)
def TO_BOOL(tx, inst):
    """`bool(TOS)`, what 3.12's conditional jumps and UNARY_NOT computed themselves. Feeding
    a conditional jump (`if t:`), the value is left for the jump, which takes its truth
    itself as on 3.12: a data-dependent condition then breaks the graph at the jump, where
    a resume function can continue (resume.py), not here."""
    if _feeds_truth_jump(tx):
        return
    tx.push(ConstantVariable(value=bool(tx.realize(tx.pop()).truth(tx))))


def _feeds_truth_jump(tx) -> bool:
    """Whether the next instruction is a jump on the truth of the value about to be pushed
    (it takes the truth itself: see TO_BOOL)."""
    nxt = tx.instructions[tx.ip] if tx.ip < len(tx.instructions) else None
    return nxt is not None and nxt.opname in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE")


@opcode(since=V313)
def COMPARE_OP(tx, inst):
    """Bit 4 (16) of the argument: coerce the result to bool (a comparison used as a condition;
    left to a conditional jump that follows, as TO_BOOL)."""
    result = compare(tx, inst)
    if inst.arg & 16 and not _feeds_truth_jump(tx):
        result = ConstantVariable(value=bool(tx.realize(result).truth(tx)))
    tx.push(result)


# `dis` gives the superinstructions' two names as a tuple, high nibble's name first.
@opcode(since=V313)
def LOAD_FAST_LOAD_FAST(tx, inst):
    first, second = inst.argval
    tx.push(load_fast_value(tx, first))
    tx.push(load_fast_value(tx, second))


@opcode(since=V313)
def STORE_FAST_STORE_FAST(tx, inst):
    """The top of the stack goes to the first name, the one below it to the second."""
    first, second = inst.argval
    store_fast_value(tx, first, tx.pop())
    store_fast_value(tx, second, tx.pop())


@opcode(since=V313)
def STORE_FAST_LOAD_FAST(tx, inst):
    first, second = inst.argval
    store_fast_value(tx, first, tx.pop())
    tx.push(load_fast_value(tx, second))


@opcode(since=V313)
def MAKE_FUNCTION(tx, inst):
    """3.13: a bare function from the code object; SET_FUNCTION_ATTRIBUTE adds the rest."""
    code = tx.pop().as_python_constant()
    tx.push(NestedFunctionVariable(fcode=code, globals_dict=tx.f_globals,
                                   globals_resolver=tx.globals_source))


def _defaults(tx, v):
    return {"fdefaults": tuple(tx.realize(v).unpack(tx))}


def _kwdefaults(tx, v):
    v = tx.realize(v)
    if not isinstance(v, DictVariable):
        unsupported(f"keyword defaults from {v.describe()}", BreakReason.UNSUPPORTED_TYPE)
    return {"fkwdefaults": dict(v.state.items)}


def _annotations(tx, v):
    return {"fannotations": v}  # kept to rebuild the function (as on 3.11/3.12)


def _closure(tx, v):
    return {"fclosure": tuple(tx.realize(v).unpack(tx))}


# SET_FUNCTION_ATTRIBUTE's flag (Include/internal/pycore_opcode_utils.h MAKE_FUNCTION_*).
_FUNCTION_ATTRIBUTES = {0x01: _defaults, 0x02: _kwdefaults, 0x04: _annotations, 0x08: _closure}


@opcode(since=V313)
def SET_FUNCTION_ATTRIBUTE(tx, inst):
    """`attr func -- func`: set one of MAKE_FUNCTION's optional parts on the function."""
    fn = tx.pop()
    value = tx.pop()
    setter = _FUNCTION_ATTRIBUTES.get(inst.arg)
    if setter is None or not isinstance(fn, NestedFunctionVariable):
        unsupported(f"SET_FUNCTION_ATTRIBUTE {inst.arg} on {fn.describe()}",
                    BreakReason.UNSUPPORTED_OPCODE)
    tx.push(dataclasses.replace(fn, **setter(tx, value)))


@opcode(since=V313)
def CONVERT_VALUE(tx, inst):
    """`!s`, `!r`, `!a` of an f-string field (argument 1, 2, 3)."""
    conv = CONVERSIONS.get(inst.arg)
    if conv is None:
        unsupported(f"CONVERT_VALUE {inst.arg}", BreakReason.UNSUPPORTED_OPCODE)
    tx.push(format_constant(tx, tx.pop(), conv, None))


@opcode(since=V313)
def FORMAT_SIMPLE(tx, inst):
    tx.push(format_constant(tx, tx.pop(), None, ""))


@opcode(since=V313)
def FORMAT_WITH_SPEC(tx, inst):
    spec = tx.pop().as_python_constant()
    tx.push(format_constant(tx, tx.pop(), None, spec))

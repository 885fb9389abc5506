"""Instructions a graph break can run eagerly that are neither calls nor jumps.

Owns the table of *stack instructions* (`STACK_OPS`): instructions whose effect depends only on
their stack inputs and their argument (an attribute read or write, a subscript, a binary or
unary operator, a comparison, string formatting, unpacking). When the converter cannot model
one (an attribute of an object it does not know, a tensor formatted into a string, an
attribute set on a tensor), the frame does not run eagerly: the entry calls the graph captured
so far, runs that one instruction on the real values, and continues in a resume function at
the next instruction, as at a call. For each instruction the table gives how many values it
consumes, the shape of what it leaves (VALUE or NULL per slot, bottom first), and how the
entry emits it (name arguments are re-indexed into the entry's own `co_names`; a method load
becomes a plain attribute load, its NULL pushed beside it by the resume prologue, which
CPython's CALL treats the same way as an unbound method and its self). Does not own when a break happens (capture.py) or the rest of the entry (emit.py).
"""

from __future__ import annotations

import sys
from typing import Callable

from ferrodyn.resume.code import NULL, VALUE

_VERSION = sys.version_info[:2]


def _attr_name(code, inst) -> tuple[str, bool]:
    """(attribute name, method form) of a LOAD_ATTR / LOAD_METHOD / STORE_ATTR / DELETE_ATTR."""
    arg = inst.arg or 0
    if inst.opname == "LOAD_ATTR" and _VERSION >= (3, 12):
        return code.co_names[arg >> 1], bool(arg & 1)
    return code.co_names[arg], inst.opname == "LOAD_METHOD"


def _load_attr_outputs(code, inst) -> tuple[int, ...]:
    if not _attr_name(code, inst)[1]:
        return (VALUE,)
    # method form: [NULL, bound attribute] (3.11, 3.12) or [bound attribute, NULL] (3.13)
    return (VALUE, NULL) if _VERSION >= (3, 13) else (NULL, VALUE)


def _emit_load_attr(e, code, inst) -> None:
    # the method form's NULL is not pushed here: the entry's stack holds values only, and the
    # resume prologue pushes the NULLs its shape names
    e.emit(e.b.load_attr(_attr_name(code, inst)[0]))


def _emit_named(opname: str):
    def emit(e, code, inst) -> None:
        e.emit(e.inst(opname, e.b.name(_attr_name(code, inst)[0])))
    return emit


def _emit_verbatim(e, code, inst) -> None:
    e.emit(e.inst(inst.opname, inst.arg))


class StackOp:
    """One stack instruction: `inputs(inst)` values consumed, `outputs(code, inst)` slot kinds
    left (bottom first), `emit(e, code, inst)` its instructions in the entry, which leave
    just the VALUE slots on the entry's stack."""

    def __init__(self, inputs: int | Callable, outputs: int | Callable,
                 emit: Callable = _emit_verbatim):
        self._inputs, self._outputs, self.emit = inputs, outputs, emit

    def inputs(self, inst) -> int:
        return self._inputs(inst) if callable(self._inputs) else self._inputs

    def outputs(self, code, inst) -> tuple[int, ...]:
        if callable(self._outputs):
            return self._outputs(code, inst)
        return (VALUE,) * self._outputs


def _format_value_inputs(inst) -> int:
    return 2 if (inst.arg or 0) & 0x04 else 1  # FVS_HAVE_SPEC: a format spec above the value


STACK_OPS: dict[str, StackOp] = {
    "BINARY_SUBSCR": StackOp(2, 1),
    "STORE_SUBSCR": StackOp(3, 0),
    "DELETE_SUBSCR": StackOp(2, 0),
    "BINARY_OP": StackOp(2, 1),
    "COMPARE_OP": StackOp(2, 1),
    "CONTAINS_OP": StackOp(2, 1),
    "UNARY_NEGATIVE": StackOp(1, 1),
    "UNARY_NOT": StackOp(1, 1),
    "UNARY_INVERT": StackOp(1, 1),
    "BUILD_STRING": StackOp(lambda inst: inst.arg or 0, 1),
    "BUILD_SLICE": StackOp(lambda inst: inst.arg or 0, 1),
    "UNPACK_SEQUENCE": StackOp(1, lambda code, inst: (VALUE,) * (inst.arg or 0)),
    "LOAD_ATTR": StackOp(1, _load_attr_outputs, _emit_load_attr),
    "STORE_ATTR": StackOp(2, 0, _emit_named("STORE_ATTR")),
    "DELETE_ATTR": StackOp(1, 0, _emit_named("DELETE_ATTR")),
}
if _VERSION < (3, 12):
    STACK_OPS["LOAD_METHOD"] = StackOp(1, _load_attr_outputs, _emit_load_attr)
if _VERSION < (3, 13):
    STACK_OPS["FORMAT_VALUE"] = StackOp(_format_value_inputs, 1)
else:
    STACK_OPS["FORMAT_SIMPLE"] = StackOp(1, 1)
    STACK_OPS["FORMAT_WITH_SPEC"] = StackOp(2, 1)
    STACK_OPS["CONVERT_VALUE"] = StackOp(1, 1)
if _VERSION >= (3, 12):
    STACK_OPS["BINARY_SLICE"] = StackOp(3, 1)
    STACK_OPS["STORE_SLICE"] = StackOp(4, 0)

"""Opcode handlers: stack manipulation and no-ops (NOP, RESUME, POP_TOP, PUSH_NULL, COPY,
SWAP, END_FOR, ...). Does not own loads/stores (opcodes_load_store.py)."""

from __future__ import annotations

from ferrodyn.symbolic.registry import opcode
from ferrodyn.variables.base import NULL


@opcode()
def NOP(tx, inst):
    """Do nothing."""


@opcode()
def RESUME(tx, inst):
    """Tracing/interrupt hook point: nothing to do."""


@opcode()
def EXTENDED_ARG(tx, inst):
    """`dis` already folds the prefix into the next instruction's argument."""


@opcode()
def CACHE(tx, inst):
    """Inline-cache slot; `dis` skips these, never executed."""


@opcode()
def POP_TOP(tx, inst):
    tx.pop()


@opcode()
def PUSH_NULL(tx, inst):
    tx.push(NULL)


@opcode()
def COPY(tx, inst):
    tx.push(tx.peek(inst.arg))


@opcode()
def SWAP(tx, inst):
    i = inst.arg
    tx.stack[-1], tx.stack[-i] = tx.stack[-i], tx.stack[-1]


@opcode(since=(3, 12), until=(3, 12))
def END_FOR(tx, inst):
    """Reached only if FOR_ITER did not skip it: pops the iterator and the last value."""
    tx.popn(2)


@opcode(since=(3, 13))
def END_FOR(tx, inst):  # noqa: F811  (one handler per version range)
    """3.13: a POP_TOP (followed by another POP_TOP for the iterator); FOR_ITER skips both."""
    tx.pop()

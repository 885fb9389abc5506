"""Opcode handlers: control flow decided at trace time (jumps on constant conditions, for
loops over trackers, returns, `with` blocks, and the generator opcodes: RETURN_GENERATOR,
YIELD_VALUE, `yield from`'s GET_YIELD_FROM_ITER/SEND/END_SEND, whose semantics live in
variables/generators.py).

A conditional jump on a tensor's truth value is data-dependent and refused (the tracker's
`truth` raises). Exception-handling opcodes are in opcodes_unsupported.py: the exceptional
paths of `with` blocks are never executed while tracing, since nothing raises.
"""

from __future__ import annotations

import sys

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.instructions import FOR_ITER_EXIT_SKIPS
from ferrodyn.symbolic.registry import NEWEST, opcode
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.constant import ConstantVariable
from ferrodyn.variables import generators
from ferrodyn.variables.lists import IteratorVariable

_VERSION = sys.version_info[:2]


@opcode()
def JUMP_FORWARD(tx, inst):
    tx.jump(inst)


@opcode()
def JUMP_BACKWARD(tx, inst):
    tx.jump(inst)


@opcode()
def JUMP_BACKWARD_NO_INTERRUPT(tx, inst):
    tx.jump(inst)


def _is_none(tx, v) -> bool:
    v = tx.realize(v)
    return isinstance(v, ConstantVariable) and v.value is None


def _jump_if(pred):
    def handler(tx, inst):
        if pred(tx, tx.pop()):
            tx.jump(inst)
    return handler


_if_true = _jump_if(lambda tx, v: tx.realize(v).truth(tx))
_if_false = _jump_if(lambda tx, v: not tx.realize(v).truth(tx))
_if_none = _jump_if(_is_none)
_if_not_none = _jump_if(lambda tx, v: not _is_none(tx, v))


def _named(name, fn, since=(3, 11), until=NEWEST):
    def handler(tx, inst):
        fn(tx, inst)
    handler.__name__ = handler.__qualname__ = name
    handler.__doc__ = f"Conditional jump ({name})."
    return opcode(since=since, until=until)(handler)


for _suffix, _fn in (("TRUE", _if_true), ("FALSE", _if_false), ("NONE", _if_none),
                     ("NOT_NONE", _if_not_none)):
    _named(f"POP_JUMP_FORWARD_IF_{_suffix}", _fn, until=(3, 11))
    _named(f"POP_JUMP_BACKWARD_IF_{_suffix}", _fn, until=(3, 11))
    _named(f"POP_JUMP_IF_{_suffix}", _fn, since=(3, 12))


@opcode(until=(3, 11))
def JUMP_IF_TRUE_OR_POP(tx, inst):
    if tx.peek().truth(tx):
        tx.jump(inst)
    else:
        tx.pop()


@opcode(until=(3, 11))
def JUMP_IF_FALSE_OR_POP(tx, inst):
    if not tx.peek().truth(tx):
        tx.jump(inst)
    else:
        tx.pop()


@opcode()
def GET_ITER(tx, inst):
    tx.push(tx.pop().iterator(tx))


@opcode()
def FOR_ITER(tx, inst):
    it = tx.peek()
    if not isinstance(it, IteratorVariable):
        unsupported(f"for over {it.describe()}", BreakReason.UNSUPPORTED_TYPE)
    item = it.next(tx)
    if item is not None:
        tx.push(item)
        return
    tx.pop()
    tx.jump(inst)
    # 3.12+: the exhausted loop resumes past the END_FOR (3.13: and its POP_TOP).
    skipped = tuple(i.opname for i in tx.instructions[tx.ip:tx.ip + len(FOR_ITER_EXIT_SKIPS)])
    if skipped != FOR_ITER_EXIT_SKIPS:
        unsupported(f"FOR_ITER exit to {skipped}, expected {FOR_ITER_EXIT_SKIPS}",
                    BreakReason.UNSUPPORTED_OPCODE)
    tx.ip += len(FOR_ITER_EXIT_SKIPS)


@opcode()
def RETURN_VALUE(tx, inst):
    tx.returned = tx.pop()


@opcode()
def BEFORE_WITH(tx, inst):
    mgr = tx.realize(tx.pop())
    exit_fn = mgr.var_getattr(tx, "__exit__")
    tx.push(exit_fn)
    tx.push(mgr.call_method(tx, "__enter__", [], {}))


@opcode()
def RETURN_GENERATOR(tx, inst):
    """Start of a generator's body (the call that made the generator already returned a
    GeneratorVariable, variables/generators.py): push the None that POP_TOP discards."""
    if tx.generator is None:
        unsupported("generator frame outside a traced generator", BreakReason.GENERATOR)
    tx.push(ConstantVariable(value=None))


@opcode()
def YIELD_VALUE(tx, inst):
    """Suspend the generator's translator with the value; its consumer resumes it, pushing
    the value `yield` evaluates to (None for `next()`, the value of `send(value)`)."""
    if tx.generator is None:
        unsupported("yield outside a traced generator", BreakReason.GENERATOR)
    generators.suspend(tx, tx.pop())


@opcode()
def GET_YIELD_FROM_ITER(tx, inst):
    tx.push(generators.yield_from_iter(tx, tx.pop()))


@opcode()
def SEND(tx, inst):
    """`yield from`: next item of the receiver (left on the stack for YIELD_VALUE), or at its
    end its return value and a jump past the loop (3.11 drops the receiver here, 3.12+ at
    END_SEND)."""
    value = tx.pop()
    more, item = generators.send(tx, tx.realize(tx.peek()), value)
    if not more and _VERSION < (3, 12):
        tx.pop()
    tx.push(item)
    if not more:
        tx.jump(inst)


@opcode(since=(3, 12))
def END_SEND(tx, inst):
    value = tx.pop()
    tx.pop()  # the receiver
    tx.push(value)

"""Opcode handlers: calls and function creation (PRECALL, KW_NAMES, CALL, CALL_FUNCTION_EX,
MAKE_FUNCTION). A call goes to the callee tracker's `call_function`; user functions inline.
"""

from __future__ import annotations

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.registry import opcode
from ferrodyn.symbolic.translator import is_null
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.dicts import DictVariable
from ferrodyn.variables.functions import NestedFunctionVariable


@opcode(until=(3, 11))
def PRECALL(tx, inst):
    """Specialization hook of 3.11: the call itself happens at CALL."""


@opcode()
def KW_NAMES(tx, inst):
    tx.kw_names = tuple(tx.code.co_consts[inst.arg])


def _call(tx, fn, args, kwargs):
    return tx.realize(fn).call_function(tx, args, kwargs)


@opcode()
def CALL(tx, inst):
    args = tx.popn(inst.arg)
    first, second = tx.popn(2)
    if is_null(first):
        fn = second
    else:
        fn, args = first, [second, *args]
    kw = tx.kw_names
    tx.kw_names = ()
    kwargs = {}
    if kw:
        kwargs = dict(zip(kw, args[len(args) - len(kw):]))
        args = args[:len(args) - len(kw)]
    tx.push(_call(tx, fn, args, kwargs))


@opcode()
def CALL_FUNCTION_EX(tx, inst):
    kwargs_var = tx.realize(tx.pop()) if inst.arg & 1 else None
    args_var = tx.realize(tx.pop())
    fn = tx.pop()
    if tx.stack and is_null(tx.peek()):
        tx.pop()
    args = args_var.iterator(tx).unpack(tx)
    kwargs = {}
    if kwargs_var is not None:
        if not isinstance(kwargs_var, DictVariable):
            unsupported(f"** of {kwargs_var.describe()}", BreakReason.UNSUPPORTED_TYPE)
        kwargs = dict(kwargs_var.state.items)
        if not all(isinstance(k, str) for k in kwargs):
            unsupported("keywords must be strings", BreakReason.EXCEPTION)
    tx.push(_call(tx, fn, args, kwargs))


@opcode()
def MAKE_FUNCTION(tx, inst):
    code = tx.pop().as_python_constant()
    flags = inst.arg
    closure = tuple(tx.pop().unpack(tx)) if flags & 0x08 else ()
    if flags & 0x04:
        tx.pop()  # annotations: not needed to run the body
    kwdefaults = dict(tx.pop().state.items) if flags & 0x02 else {}
    defaults = tuple(tx.pop().unpack(tx)) if flags & 0x01 else ()
    tx.push(NestedFunctionVariable(fcode=code, globals_dict=tx.f_globals,
                                   globals_resolver=tx.globals_source, fdefaults=defaults,
                                   fkwdefaults=kwdefaults, fclosure=closure))

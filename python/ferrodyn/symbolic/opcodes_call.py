"""Opcode handlers: calls and function creation (PRECALL, KW_NAMES, CALL, CALL_FUNCTION_EX,
MAKE_FUNCTION until 3.12). A call goes to the callee tracker's `call_function`; user functions
inline. Where the callable and its NULL/self slot sit is call_stack.py's; 3.13's CALL_KW,
MAKE_FUNCTION and SET_FUNCTION_ATTRIBUTE are in opcodes_313.py.
"""

from __future__ import annotations

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.call_stack import pop_call, pop_call_ex
from ferrodyn.symbolic.registry import opcode
from ferrodyn.variables.base import unsupported
from ferrodyn.variables.dicts import DictVariable
from ferrodyn.variables.functions import NestedFunctionVariable


@opcode(until=(3, 11))
def PRECALL(tx, inst):
    """Specialization hook of 3.11: the call itself happens at CALL."""


@opcode(until=(3, 12))
def KW_NAMES(tx, inst):
    tx.kw_names = tuple(tx.code.co_consts[inst.arg])


def _call(tx, fn, args, kwargs):
    return tx.realize(fn).call_function(tx, args, kwargs)


def call_with_names(tx, fn, args, kw: tuple[str, ...]):
    """Call `fn` with `args`, the last `len(kw)` of them passed by the keywords `kw`."""
    kwargs = {}
    if kw:
        kwargs = dict(zip(kw, args[len(args) - len(kw):]))
        args = args[:len(args) - len(kw)]
    tx.push(_call(tx, fn, args, kwargs))


@opcode()
def CALL(tx, inst):
    """On 3.11/3.12 a preceding KW_NAMES names the trailing arguments; 3.13 has CALL_KW."""
    fn, args = pop_call(tx, inst.arg)
    kw = tx.kw_names
    tx.kw_names = ()
    call_with_names(tx, fn, args, kw)


@opcode()
def CALL_FUNCTION_EX(tx, inst):
    kwargs_var = tx.realize(tx.pop()) if inst.arg & 1 else None
    args_var = tx.realize(tx.pop())
    fn = pop_call_ex(tx)
    args = args_var.iterator(tx).unpack(tx)
    kwargs = {}
    if kwargs_var is not None:
        if not isinstance(kwargs_var, DictVariable):
            unsupported(f"** of {kwargs_var.describe()}", BreakReason.UNSUPPORTED_TYPE)
        kwargs = dict(kwargs_var.state.items)
        if not all(isinstance(k, str) for k in kwargs):
            unsupported("keywords must be strings", BreakReason.EXCEPTION)
    tx.push(_call(tx, fn, args, kwargs))


@opcode(until=(3, 12))
def MAKE_FUNCTION(tx, inst):
    code = tx.pop().as_python_constant()
    flags = inst.arg
    closure = tuple(tx.pop().unpack(tx)) if flags & 0x08 else ()
    annotations = tx.pop() if flags & 0x04 else None  # kept to rebuild the function
    kwdefaults = dict(tx.pop().state.items) if flags & 0x02 else {}
    defaults = tuple(tx.pop().unpack(tx)) if flags & 0x01 else ()
    tx.push(NestedFunctionVariable(fcode=code, globals_dict=tx.f_globals,
                                   globals_resolver=tx.globals_source, fdefaults=defaults,
                                   fkwdefaults=kwdefaults, fclosure=closure,
                                   fannotations=annotations))

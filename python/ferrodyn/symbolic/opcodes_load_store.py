"""Opcode handlers: loads and stores of constants, locals, globals, cells, attributes and
imports (LOAD_CONST, LOAD_FAST*, STORE_FAST, LOAD_GLOBAL, STORE_GLOBAL, DELETE_GLOBAL,
LOAD_DEREF, STORE_DEREF, LOAD_ATTR, LOAD_METHOD, LOAD_SUPER_ATTR, STORE_ATTR, DELETE_ATTR,
MAKE_CELL, IMPORT_NAME, ...). Stores to globals, to existing cells and to attributes of objects
from outside the frame are side effects: recorded in the SideEffects table (side_effects.py)
and replayed after the graph; the trackers refuse what they cannot model.
"""

from __future__ import annotations

import sys

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.call_stack import push_callable
from ferrodyn.symbolic.registry import opcode
from ferrodyn.symbolic.translator import is_null
from ferrodyn.variables.base import NULL, unsupported
from ferrodyn.variables.builder import build_unsourced
from ferrodyn.variables.constant import ConstantVariable, is_constant_value
from ferrodyn.variables.functions import CellState, CellVariable


@opcode()
def LOAD_CONST(tx, inst):
    value = inst.argval
    if type(value) is tuple and is_constant_value(value):
        tx.push(build_unsourced(value))
    else:
        tx.push(ConstantVariable(value=value))


@opcode(since=(3, 12))
def RETURN_CONST(tx, inst):
    LOAD_CONST(tx, inst)
    tx.returned = tx.pop()


# A local slot holds either a value (kept in `tx.locals`) or, for a cell or free variable once
# MAKE_CELL / COPY_FREE_VARS ran, the cell (kept in `tx.cells`). Inlined comprehensions (3.12+)
# save a slot with LOAD_FAST_AND_CLEAR, use it for plain values, and restore it with STORE_FAST,
# also when the slot held a cell; 3.13 also reads a cell slot with LOAD_FAST to build closures.

def _is_cell_slot(tx, name) -> bool:
    return name in tx.code.co_cellvars or name in tx.code.co_freevars


def load_fast_value(tx, name):
    """What local slot `name` holds: a value, or the cell of a cell or free variable."""
    if name in tx.locals:
        v = tx.realize(tx.locals[name])
        tx.locals[name] = v
        return v
    if _is_cell_slot(tx, name) and name in tx.cells:
        return tx.cells[name]
    unsupported(f"UnboundLocalError: {name!r}", BreakReason.EXCEPTION)


@opcode()
def LOAD_FAST(tx, inst):
    tx.push(load_fast_value(tx, inst.argval))


@opcode(since=(3, 12))
def LOAD_FAST_CHECK(tx, inst):
    tx.push(load_fast_value(tx, inst.argval))


@opcode(since=(3, 12))
def LOAD_FAST_AND_CLEAR(tx, inst):
    """Inlined comprehensions: save the slot's content (a value, a cell, or NULL) and clear it."""
    name = inst.argval
    v = tx.locals.pop(name, NULL)
    if is_null(v) and _is_cell_slot(tx, name):
        v = tx.cells.pop(name, NULL)
    tx.stack.append(v)


def store_fast_value(tx, name, v):
    """Set local slot `name` to `v`: a NULL (from LOAD_FAST_AND_CLEAR) unbinds it, a cell
    saved from a cell slot goes back to being that variable's cell, any other value replaces
    what the slot held."""
    if _is_cell_slot(tx, name):
        tx.cells.pop(name, None)
    if is_null(v):
        tx.locals.pop(name, None)
    elif isinstance(v, CellVariable) and _is_cell_slot(tx, name):
        tx.locals.pop(name, None)
        tx.cells[name] = v
    else:
        tx.locals[name] = v


@opcode()
def STORE_FAST(tx, inst):
    store_fast_value(tx, inst.argval, tx.pop())


@opcode()
def DELETE_FAST(tx, inst):
    if inst.argval not in tx.locals:
        unsupported(f"UnboundLocalError: {inst.argval!r}", BreakReason.EXCEPTION)
    del tx.locals[inst.argval]


@opcode()
def LOAD_GLOBAL(tx, inst):
    """Bit 0: the global is the callable of a coming call (pushed with its NULL slot)."""
    v = tx.load_global(inst.argval)
    if inst.arg & 1:
        push_callable(tx, v)
    else:
        tx.push(v)


@opcode()
def STORE_GLOBAL(tx, inst):
    tx.output.side_effects.store_global(tx.f_globals, inst.argval, tx.pop())


@opcode()
def DELETE_GLOBAL(tx, inst):
    from ferrodyn.side_effects import DELETED
    table, name = tx.output.side_effects, inst.argval
    pending = table.pending_global(tx.f_globals, name)
    if pending is DELETED or (pending is None and name not in tx.f_globals):
        unsupported(f"NameError: name {name!r} is not defined", BreakReason.EXCEPTION)
    table.store_global(tx.f_globals, name, DELETED)


@opcode()
def MAKE_CELL(tx, inst):
    name = inst.argval
    content = tx.locals.pop(name, None)
    tx.cells[name] = CellVariable(state=CellState(content))


@opcode()
def COPY_FREE_VARS(tx, inst):
    """Closure cells were bound when the translator was made."""


@opcode(until=(3, 12))
def LOAD_CLOSURE(tx, inst):
    tx.push(tx.cell(inst.argval))


@opcode()
def LOAD_DEREF(tx, inst):
    tx.push(tx.cell(inst.argval).load(tx, inst.argval))


@opcode()
def STORE_DEREF(tx, inst):
    tx.cell(inst.argval).store(tx, inst.argval, tx.pop())


@opcode(until=(3, 11))
def LOAD_ATTR(tx, inst):
    obj = tx.pop()
    tx.push(obj.var_getattr(tx, inst.argval))


@opcode(since=(3, 12))
def LOAD_ATTR(tx, inst):  # noqa: F811  (one handler per version range)
    """Bit 0 (3.12+): a method load, the attribute is the callable of a coming call."""
    obj = tx.pop()
    attr = obj.var_getattr(tx, inst.argval)
    if inst.arg & 1:
        push_callable(tx, attr)
    else:
        tx.push(attr)


@opcode(until=(3, 11))
def LOAD_METHOD(tx, inst):
    obj = tx.pop()
    push_callable(tx, obj.var_getattr(tx, inst.argval))


@opcode(since=(3, 12))
def LOAD_SUPER_ATTR(tx, inst):
    """`super().name` (bit 0: method load; bit 1: two-argument super)."""
    from ferrodyn.variables.super_vars import SuperVariable
    obj = tx.pop()
    cls = tx.pop()
    tx.pop()  # the global `super`
    sup = SuperVariable(cls=cls.as_python_constant(), obj=obj)
    attr = sup.var_getattr(tx, inst.argval)
    if inst.arg & 1:
        push_callable(tx, attr)
    else:
        tx.push(attr)


@opcode()
def STORE_ATTR(tx, inst):
    obj = tx.pop()
    value = tx.pop()
    obj.setattr(tx, inst.argval, value)


@opcode()
def DELETE_ATTR(tx, inst):
    obj = tx.pop()
    delattr_ = getattr(obj, "delattr", None)
    if delattr_ is None:
        unsupported(f"attribute deletion on {obj.describe()}", BreakReason.SIDE_EFFECT)
    delattr_(tx, inst.argval)


@opcode()
def LOAD_ASSERTION_ERROR(tx, inst):
    """Only reached when an `assert` fails at trace time."""
    unsupported("assertion failed while tracing", BreakReason.EXCEPTION)


@opcode()
def IMPORT_NAME(tx, inst):
    fromlist = tx.pop()
    level = tx.pop().as_python_constant()
    name = inst.argval
    if level != 0 or name not in sys.modules:
        unsupported(f"import of {name!r} (not yet imported)", BreakReason.SIDE_EFFECT)
    fl = fromlist.as_python_constant()
    mod = sys.modules[name] if fl else sys.modules[name.partition(".")[0]]
    tx.push(build_unsourced(mod))


@opcode()
def IMPORT_FROM(tx, inst):
    tx.push(tx.peek().var_getattr(tx, inst.argval))

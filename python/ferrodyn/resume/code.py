"""Resume functions' code: a new code object continuing an original code object at an offset.

Owns `resume_code` (the prologue that takes the original's locals and the live stack as
arguments, rebuilds the stack, re-makes a nested call or re-raises into a handler, and jumps
into the original's instructions, copied byte for byte after it), the map from a resume code
back to its original (`origin`, `prologue_call`), and offsets of the original
(`next_offset`, `jump_target_offset`, `inst_at`). Resume codes are always generated from the
*original* code and cached per (code, offset, stack shape, unbound locals, ...), so breaks in
sequence and recompiles reuse them. Does not own when to break (capture.py) or the entry's
instructions (emit.py).
"""

from __future__ import annotations

import inspect
import types
import weakref

from ferrodyn import bytecode

def inst_at(insts, offset: int):
    """The assembler instruction whose code units contain byte `offset`."""
    best = None
    for i in insts:
        if i.offset <= offset:
            best = i
        else:
            break
    return best



# ---------------------------------------------------------------------------------------------
# Resume functions
# ---------------------------------------------------------------------------------------------

_STACK = "__ferrodyn_stack"
_NESTED_FN = "__ferrodyn_nested_fn"
_NESTED_ARGS = "__ferrodyn_nested_args"
_RESUME_CODES: "weakref.WeakKeyDictionary[types.CodeType, dict]" = weakref.WeakKeyDictionary()
_ORIGIN: "weakref.WeakKeyDictionary[types.CodeType, tuple]" = weakref.WeakKeyDictionary()


# instructions whose argument indexes the cell/free slots (after the locals)
_DEREF_OPS = frozenset({"LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE", "MAKE_CELL",
                        "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF"})

_FAST_OPS = frozenset({"LOAD_FAST", "STORE_FAST", "DELETE_FAST", "LOAD_FAST_CHECK",
                       "LOAD_FAST_AND_CLEAR"})
_FAST_PAIR_OPS = frozenset({"LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST"})
_CELL = "__ferrodyn_cell"

# kinds of stack slots a resume prologue rebuilds; EXIT: a live autocast `with` block's exit,
# passed as a callable (capture.AutocastReenter) that enters it again and gives its __exit__
NULL, VALUE, ITER, EXIT = 0, 1, 2, 3


def resume_code(code: types.CodeType, offset: int, shape: tuple[int, ...],
                unbound: frozenset[int], nested_call: int | None = None,
                raise_at: int | None = None) -> types.CodeType:
    """The code of the resume function continuing `code` at the instruction at byte `offset`
    with a stack of `len(shape)` slots (NULL, VALUE, ITER: an iterator over the tuple
    passed, or EXIT: the result of calling the value passed) and the locals `unbound` unset.
    The cells of `code` (co_cellvars + co_freevars) are arguments after the locals: the
    prologue stores each into its cell slot (the resume code has them all as cell variables,
    no free variables), so the resume function shares the frame's cell objects.

    `nested_call` (nested breaks): the byte offset of the call in `code` that inlined the
    frame which broke; `offset` is the instruction after it. The resume function then takes
    two more arguments, the inner frame's continuation and its argument tuple, and its
    prologue makes that call (`fn(*args)`, its result pushed on the rebuilt stack) before
    jumping to `offset`: tracing it inlines the inner continuation, so everything after the
    break, at every level, is one graph.

    `raise_at` (an exception from the instruction at that byte, run at the break): `offset`
    is its exception handler, the last stack value is the exception, and the prologue pushes
    below it, when the handler wants it, the raising instruction's index in the new code
    (`lasti`: what RERAISE uses to find the next handler, the same as in the original)."""
    per_code = _RESUME_CODES.setdefault(code, {})
    key = (offset, shape, unbound, nested_call, raise_at)
    hit = per_code.get(key)
    if hit is not None:
        return hit
    insts = bytecode.decode(code)
    target = next((i for i in insts if i.offset == offset), None)
    if target is None:
        raise ValueError(f"resume_code: no instruction at byte {offset} of {code.co_name}")
    b = bytecode.CodeBuilder(consts=code.co_consts, names=code.co_names,
                             varnames=code.co_varnames, positions=target.positions)
    n_stack = sum(1 for kind in shape if kind != NULL)
    cells = code.co_cellvars + code.co_freevars
    cell_args = [f"{_CELL}{j}" for j in range(len(cells))]
    stack_names = [f"{_STACK}{k}" for k in range(n_stack)]
    if nested_call is not None:
        stack_names += [_NESTED_FN, _NESTED_ARGS]
    assert not set(cell_args + stack_names) & set(code.co_varnames), "resume_code of a resume code"
    for n in cell_args + stack_names:
        b.local(n)
    added = len(b.varnames) - len(code.co_varnames)
    if cells:
        _shift_cell_slots(insts, len(code.co_varnames), added)
    prologue = [b.resume()]
    prologue += [b.inst("DELETE_FAST", i) for i in sorted(unbound)]
    # The frame's cells are arguments (the very cell objects of the frame it continues, so
    # that functions made before the break share them): each goes into its cell slot. The
    # MAKE_CELL first (its cell is replaced at once) makes the slot one whose MAKE_CELL ran,
    # so frame introspection (f_locals, locals()) reads the cell's contents, as in the original.
    for j, (name, slot) in enumerate(_cell_slots(code, len(b.varnames))):
        prologue += [b.inst("MAKE_CELL", slot, argval=name), b.load_fast(cell_args[j]),
                     b.inst("STORE_FAST", slot, argval=name)]
    lasti = None
    if raise_at is not None:
        h = inst_at(insts, raise_at).exn
        assert h is not None and h.target is target, "raise_at: not the instruction's handler"
        if h.lasti:
            lasti = b.inst("LOAD_CONST", b.const(_LastiPlaceholder))
    k = 0
    for kind in shape:
        if kind == NULL:
            prologue.append(b.inst("PUSH_NULL"))
            continue
        if lasti is not None and k == n_stack - 1:
            prologue.append(lasti)
        if kind == EXIT:
            prologue += [*b.call_prefix(), b.load_fast(stack_names[k]), *b.call_infix(),
                         *b.call(0)]
        else:
            prologue.append(b.load_fast(stack_names[k]))
        if kind == ITER:
            prologue.append(b.inst("GET_ITER"))
        k += 1
    # the added arguments are gone, as in the original frame (its locals(), f_locals)
    prologue += [b.inst("DELETE_FAST", b.local(n)) for n in cell_args + stack_names[:n_stack]]
    if nested_call is not None:
        # the call stands for the original's: an exception from the inner frames goes to
        # the handler around it (a `try`, a `with` cleanup), with the same stack below
        call = inst_at(insts, nested_call)
        prologue += [*b.call_prefix(), b.load_fast(_NESTED_FN), *b.call_infix(),
                     b.load_fast(_NESTED_ARGS),
                     b.inst("CALL_FUNCTION_EX", 0, positions=call.positions, exn=call.exn),
                     b.inst("DELETE_FAST", b.local(_NESTED_FN)),
                     b.inst("DELETE_FAST", b.local(_NESTED_ARGS))]
    prologue.append(b.inst("JUMP", target=target))
    line = target.lineno or code.co_firstlineno
    name = f"ferrodyn_resume_in_{code.co_name}_at_{line}"
    flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    new = bytecode.assemble(
        prologue + insts, code, co_argcount=len(b.varnames), co_posonlyargcount=0,
        co_kwonlyargcount=0, co_varnames=tuple(b.varnames), co_nlocals=len(b.varnames),
        co_consts=tuple(b.consts), co_names=tuple(b.names), co_flags=flags, co_name=name,
        co_qualname=f"{code.co_qualname}.<{name}>", co_cellvars=cells, co_freevars=())
    after = bytecode.decode(new)[len(prologue):]
    shift = after[0].offset - insts[0].offset
    if any(a.offset - i.offset != shift for a, i in zip(after, insts)):
        raise ValueError(f"resume_code: {code.co_name}'s instructions moved (an argument grew)")
    if lasti is not None:
        consts = list(new.co_consts)
        consts[lasti.arg] = (raise_at + shift) // 2  # in code units, as CPython pushes it
        new = new.replace(co_consts=tuple(consts))
    _ORIGIN[new] = (code, shift, nested_call)
    per_code[key] = new
    return new


def _cell_slots(code: types.CodeType, n_varnames: int) -> list[tuple[str, int]]:
    """(name, slot) of each cell and free variable of `code` (co_cellvars + co_freevars
    order) in its resume code, which has `n_varnames` locals and those names as cell
    variables only: an argument that is a cell keeps its local slot, the others follow the
    locals in that order (CPython's localsplus layout, Objects/codeobject.c)."""
    out, k = [], n_varnames
    for name in code.co_cellvars + code.co_freevars:
        if name in code.co_varnames:
            out.append((name, code.co_varnames.index(name)))
        else:
            out.append((name, k))
            k += 1
    return out


def _shift_cell_slots(insts, n_varnames: int, added: int) -> None:
    """Cell and free slots follow the locals: the `added` locals of a resume code move them.
    Instructions naming a slot (the deref family; the fast family on a cell slot: 3.12's
    inlined comprehensions, 3.13's LOAD_CLOSURE) get the new index."""
    for i in insts:
        if (i.opname in _DEREF_OPS or i.opname in _FAST_OPS) and i.arg >= n_varnames:
            i.arg += added  # (an argument that is a cell keeps its slot among the locals)
        elif i.opname in _FAST_PAIR_OPS:  # 3.13: two 4-bit slot indexes
            hi, lo = i.arg >> 4, i.arg & 15
            hi, lo = (hi + added if hi >= n_varnames else hi), (lo + added if lo >= n_varnames else lo)
            if hi > 15 or lo > 15:
                raise ValueError("resume_code: a paired local instruction names a moved cell slot")
            i.arg = hi << 4 | lo


class _LastiPlaceholder:
    """Stands in co_consts for a resume prologue's lasti until the code is laid out."""


def origin(code: types.CodeType) -> tuple[types.CodeType, int]:
    """(original code, byte shift) of a resume code: its instructions after the prologue are
    the original's, byte for byte, `shift` bytes later. (code, 0) for any other code."""
    return _ORIGIN.get(code, (code, 0, None))[:2]


def prologue_call(code: types.CodeType) -> int | None:
    """For a nested resume code: the byte offset, in the original, of the call its prologue
    makes again (a frame stopped at that prologue call is, in the original, at that call)."""
    return _ORIGIN.get(code, (code, 0, None))[2]


def next_offset(code: types.CodeType, offset: int) -> int:
    insts = bytecode.decode(code)
    for k, i in enumerate(insts):
        if i.offset <= offset < (insts[k + 1].offset if k + 1 < len(insts) else 1 << 62):
            return insts[k + 1].offset
    raise ValueError(f"no instruction after byte {offset} of {code.co_name}")


def jump_target_offset(code: types.CodeType, offset: int) -> int:
    return inst_at(bytecode.decode(code), offset).target.offset



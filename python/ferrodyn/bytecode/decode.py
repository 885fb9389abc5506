"""Decoding a code object into the assembler's instruction model.

Owns `decode(code)`: walks `co_code` code unit by code unit, folds EXTENDED_ARG prefixes into
the next instruction's argument, skips inline CACHE entries, resolves jump arguments to target
instructions (relative to the end of the jumping instruction's caches, backwards for
`*BACKWARD*` opcodes) and exception-table ranges to `ExnHandler`s, and attaches
`co_positions()` to each instruction. The raw `arg` is kept for every non-jump instruction,
so `assemble(decode(code), code)` reproduces `co_code`.
"""

from __future__ import annotations

from types import CodeType

from . import exception_table
from .instruction import ExnHandler, Inst, Positions
from .opinfo import BACKWARD_JUMPS, CACHE_SIZE, EXTENDED_ARG, HAVE_ARGUMENT, JUMPS, OPNAME


def decode(code: CodeType) -> list[Inst]:
    raw = code.co_code
    positions = list(code.co_positions())
    n_units = len(raw) // 2
    insts: list[Inst] = []
    start_of: dict[int, Inst] = {}      # code unit where an instruction (with prefixes) starts
    jumps: list[tuple[Inst, int]] = []  # (instruction, target unit)
    unit = 0
    ext = 0
    start = None
    while unit < n_units:
        op, a = raw[2 * unit], raw[2 * unit + 1]
        if start is None:
            start = unit
        if op == EXTENDED_ARG:
            ext = (ext | a) << 8
            unit += 1
            continue
        name = OPNAME.get(op)
        if name is None:
            raise ValueError(f"decode: unknown opcode {op} at byte {2 * unit} of {code.co_name}")
        arg = ext | a
        ext = 0
        inst = Inst(name, arg if op >= HAVE_ARGUMENT else None,
                    positions=Positions(*positions[unit]), offset=2 * start)
        if op < HAVE_ARGUMENT and a:
            raise ValueError(f"decode: {name} at byte {2 * unit} carries argument {a}")
        insts.append(inst)
        start_of[start] = inst
        after = unit + 1 + CACHE_SIZE[name]
        if name in JUMPS:
            jumps.append((inst, after - arg if name in BACKWARD_JUMPS else after + arg))
        unit = after
        start = None
    for inst, target in jumps:
        inst.target = _at(start_of, target, code)
        inst.argval = 2 * target
    handlers: dict[tuple, ExnHandler] = {}
    for u, e in exception_table.iter_units(exception_table.parse(code.co_exceptiontable)):
        inst = start_of.get(u)
        if inst is None:
            continue  # a prefix or cache unit inside an instruction
        key = (e.target, e.depth, e.lasti)
        h = handlers.get(key)
        if h is None:
            h = handlers[key] = ExnHandler(_at(start_of, e.target, code), e.depth, e.lasti)
        inst.exn = h
    return insts


def _at(start_of: dict[int, Inst], unit: int, code: CodeType) -> Inst:
    inst = start_of.get(unit)
    if inst is None:
        raise ValueError(f"decode: no instruction starts at byte {2 * unit} of {code.co_name}")
    return inst

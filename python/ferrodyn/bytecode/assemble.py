"""Assembling an instruction list into a code object.

Owns `assemble(insts, template, **fields)`: picks the direction of each jump (3.11's
`POP_JUMP_FORWARD_IF_*`/`..._BACKWARD_...`, `JUMP_FORWARD`/`JUMP_BACKWARD`), computes jump
arguments and the EXTENDED_ARG prefixes every argument needs (iterated to a fixed point: a
prefix moves the instructions after it), writes the inline CACHE entries, and derives the
exception table, the location table, `co_stacksize` and `co_flags`. The other fields of the
code object come from `template` (through `CodeType.replace`, which is version-neutral).

Also owns `CodeBuilder`, which keeps the constant/name/local tables of a code object being
built and turns values into instruction arguments (LOAD_GLOBAL's and LOAD_ATTR's flag bits
included).
"""

from __future__ import annotations

import inspect
from types import CodeType
from typing import Any, Iterable

from . import exception_table, linetable
from .exception_table import ExnEntry
from .instruction import Inst, Positions
from .opinfo import CACHE_SIZE, EXTENDED_ARG, HAVE_ARGUMENT, OPMAP, VERSION, is_jump, jump_opname
from .stackdepth import stack_depths

_GEN_OPS = frozenset({"YIELD_VALUE", "RETURN_GENERATOR"})


def _ext_needed(arg: int) -> int:
    if arg < 0:
        raise ValueError(f"assemble: negative argument {arg}")
    if arg <= 0xFF:
        return 0
    if arg <= 0xFFFF:
        return 1
    if arg <= 0xFFFFFF:
        return 2
    if arg <= 0xFFFFFFFF:
        return 3
    raise ValueError(f"assemble: argument {arg} does not fit in 32 bits")


def _layout(insts: list[Inst]) -> tuple[list[str], list[int], list[int], list[int]]:
    """(opname, arg, EXTENDED_ARG count, start unit) per instruction, jumps resolved."""
    n = len(insts)
    index = {id(i): k for k, i in enumerate(insts)}
    names = [i.opname for i in insts]
    args = [i.arg for i in insts]
    ext = [0] * n
    for k, i in enumerate(insts):
        if is_jump(i.opname):
            if i.target is None or id(i.target) not in index:
                raise ValueError(f"assemble: jump {i!r} has no target in this instruction list")
            names[k] = jump_opname(i.opname, index[id(i.target)] <= k)
        elif args[k] is not None:
            ext[k] = _ext_needed(args[k])
    while True:
        starts, u = [], 0
        for k in range(n):
            starts.append(u)
            u += ext[k] + 1 + CACHE_SIZE[names[k]]
        changed = False
        for k, i in enumerate(insts):
            if not is_jump(i.opname):
                continue
            after = starts[k] + ext[k] + 1 + CACHE_SIZE[names[k]]
            t = starts[index[id(i.target)]]
            args[k] = after - t if index[id(i.target)] <= k else t - after
            need = _ext_needed(args[k])
            if need > ext[k]:
                ext[k] = need
                changed = True
        if not changed:
            return names, args, ext, starts


def _exception_entries(insts: list[Inst], starts: list[int], sizes: list[int]) -> list[ExnEntry]:
    index = {id(i): k for k, i in enumerate(insts)}
    entries: list[ExnEntry] = []
    cur = None  # (target unit, depth, lasti), start unit
    cur_start = 0
    for k, inst in enumerate(insts):
        key = None
        if inst.exn is not None:
            if id(inst.exn.target) not in index:
                raise ValueError(f"assemble: handler of {inst!r} is not in this instruction list")
            key = (starts[index[id(inst.exn.target)]], inst.exn.depth, inst.exn.lasti)
        if key != cur:
            if cur is not None:
                entries.append(ExnEntry(cur_start, starts[k], *cur))
            cur, cur_start = key, starts[k]
    if cur is not None:
        entries.append(ExnEntry(cur_start, starts[-1] + sizes[-1], *cur))
    return entries


def compute_flags(insts: Iterable[Inst], base: int) -> int:
    """`base` (signature flags: VARARGS, VARKEYWORDS, NESTED, OPTIMIZED, NEWLOCALS, ...) with
    GENERATOR set when the code yields (coroutine kinds must be given in `base`)."""
    flags = base
    if not flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        if any(i.opname in _GEN_OPS for i in insts):
            flags |= inspect.CO_GENERATOR
    return flags


def assemble(insts: list[Inst], template: CodeType, **fields: Any) -> CodeType:
    """A code object running `insts`. Everything not derived from the instructions comes
    from `template` and `fields` (keyword arguments of `CodeType.replace`); `co_flags` is
    `compute_flags(insts, fields.get("co_flags", template.co_flags))`."""
    if not insts:
        raise ValueError("assemble: no instructions")
    for inst in insts:
        if is_jump(inst.opname):
            continue
        if inst.opname not in OPMAP or inst.opname in ("CACHE", "EXTENDED_ARG"):
            raise ValueError(f"assemble: {inst.opname} is not a real instruction")
        if inst.arg is None and OPMAP[inst.opname] >= HAVE_ARGUMENT:
            raise ValueError(f"assemble: {inst!r} needs an argument")
    names, args, ext, starts = _layout(insts)
    code = bytearray()
    sizes = []
    for k in range(len(insts)):
        arg = args[k] or 0
        for j in range(ext[k], 0, -1):
            code += bytes((EXTENDED_ARG, (arg >> (8 * j)) & 0xFF))
        code += bytes((OPMAP[names[k]], arg & 0xFF))
        code += b"\0\0" * CACHE_SIZE[names[k]]
        sizes.append(ext[k] + 1 + CACHE_SIZE[names[k]])
    firstlineno = fields.get("co_firstlineno", template.co_firstlineno)
    lines = linetable.encode([(i.positions, s) for i, s in zip(insts, sizes)], firstlineno)
    exn = exception_table.encode(_exception_entries(insts, starts, sizes))
    depth, _ = stack_depths(insts, names, args)
    flags = compute_flags(insts, fields.pop("co_flags", template.co_flags))
    return template.replace(co_code=bytes(code), co_linetable=lines, co_exceptiontable=exn,
                            co_stacksize=depth, co_flags=flags, **fields)


class CodeBuilder:
    """Tables of a code object being built, and instructions made from values.

    `const(v)` / `name(s)` / `local(s)` return table indexes (appending on first use);
    the instruction helpers return `Inst`s with raw arguments, laid out for the running
    CPython version (`load_global(name, push_null)` sets the low bit; 3.12+ `load_attr`
    shifts the name index)."""

    def __init__(self, consts: Iterable[Any] = (), names: Iterable[str] = (),
                 varnames: Iterable[str] = (), positions: Positions | None = None):
        self.consts: list[Any] = list(consts)
        self.names: list[str] = list(names)
        self.varnames: list[str] = list(varnames)
        self.positions = positions or Positions()

    def const(self, value: Any) -> int:
        for k, c in enumerate(self.consts):
            if c is value or (type(c) is type(value) and _simple(value) and c == value):
                return k
        self.consts.append(value)
        return len(self.consts) - 1

    def name(self, s: str) -> int:
        if s not in self.names:
            self.names.append(s)
        return self.names.index(s)

    def local(self, s: str) -> int:
        if s not in self.varnames:
            self.varnames.append(s)
        return self.varnames.index(s)

    def inst(self, opname: str, arg: int | None = None, **kw: Any) -> Inst:
        kw.setdefault("positions", self.positions)
        return Inst(opname, arg, **kw)

    # -- loads and stores -------------------------------------------------------------------
    def load_const(self, value: Any) -> Inst:
        return self.inst("LOAD_CONST", self.const(value), argval=value)

    def load_fast(self, s: str) -> Inst:
        return self.inst("LOAD_FAST", self.local(s), argval=s)

    def store_fast(self, s: str) -> Inst:
        return self.inst("STORE_FAST", self.local(s), argval=s)

    def load_global(self, s: str, push_null: bool = False) -> Inst:
        return self.inst("LOAD_GLOBAL", (self.name(s) << 1) | int(push_null), argval=s)

    def load_attr(self, s: str) -> Inst:
        idx = self.name(s)
        return self.inst("LOAD_ATTR", idx if VERSION < (3, 12) else idx << 1, argval=s)

    # -- calls ----------------------------------------------------------------------------
    def call_prefix(self) -> list[Inst]:
        """Before the callable is loaded: the NULL that 3.11 and 3.12 put below it."""
        return [self.inst("PUSH_NULL")] if VERSION < (3, 13) else []

    def call_infix(self) -> list[Inst]:
        """After the callable is loaded, before its arguments (3.13's NULL)."""
        return [self.inst("PUSH_NULL")] if VERSION >= (3, 13) else []

    def call(self, nargs: int, kwnames: tuple[str, ...] = ()) -> list[Inst]:
        """Call with `nargs` arguments on the stack (the last len(kwnames) are keywords)."""
        out: list[Inst] = []
        if VERSION >= (3, 13):
            if kwnames:
                return [self.load_const(tuple(kwnames)), self.inst("CALL_KW", nargs)]
            return [self.inst("CALL", nargs)]
        if kwnames:
            out.append(self.inst("KW_NAMES", self.const(tuple(kwnames))))
        if VERSION < (3, 12):
            out.append(self.inst("PRECALL", nargs))
        out.append(self.inst("CALL", nargs))
        return out

    def resume(self) -> Inst:
        return self.inst("RESUME", 0)


def _simple(v: Any) -> bool:
    return v is None or type(v) in (int, str, bytes, bool)  # floats: 0.0 == -0.0

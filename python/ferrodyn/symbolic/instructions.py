"""Decoding a code object into instructions the translator steps through (3.11 and 3.12).

Owns `Instruction` (opcode name, argument, resolved argument value, line, jump target as an
index) and `decode`, built on `dis.get_instructions` (CACHE entries are skipped by `dis`;
EXTENDED_ARG is folded into the next instruction's argument). Does not own what instructions
do (the opcode modules).
"""

from __future__ import annotations

import dis
import types
from dataclasses import dataclass
from typing import Any

_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


@dataclass(frozen=True)
class Instruction:
    opname: str
    arg: int | None
    argval: Any
    argrepr: str
    offset: int
    lineno: int | None
    target: int | None  # index of the jump target in the decoded list, for jumps


# id(code) -> (code, instructions); keyed by identity (equal code objects may differ in
# co_filename), holding the code so its id is not reused while cached.
_CACHE: dict[int, tuple[types.CodeType, tuple[Instruction, ...]]] = {}
_CACHE_LIMIT = 2048


def decode(code: types.CodeType) -> tuple[Instruction, ...]:
    """Decoded instructions of `code` (cached: instructions are immutable)."""
    hit = _CACHE.get(id(code))
    if hit is None or hit[0] is not code:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        hit = _CACHE[id(code)] = (code, tuple(_decode(code)))
    return hit[1]


def _decode(code: types.CodeType) -> list[Instruction]:
    raw = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    index_of = {inst.offset: n for n, inst in enumerate(raw)}
    out = []
    line = code.co_firstlineno
    for inst in raw:
        pos = getattr(inst, "positions", None)
        if pos is not None and pos.lineno is not None:
            line = pos.lineno
        target = None
        if inst.opcode in _JUMPS and isinstance(inst.argval, int):
            target = index_of.get(inst.argval)
        out.append(Instruction(inst.opname, inst.arg, inst.argval, inst.argrepr, inst.offset,
                               line, target))
    return out

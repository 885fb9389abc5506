"""Decoding a code object into instructions the translator steps through (3.11 to 3.13).

Owns `Instruction` (opcode name, argument, resolved argument value, line, jump target as an
index), `decode`, built on `dis.get_instructions` (CACHE entries are skipped by `dis`;
EXTENDED_ARG is folded into the next instruction's argument; 3.13's superinstructions such as
LOAD_FAST_LOAD_FAST keep their pair of names as a tuple `argval`), and the per-version facts
about control flow that `dis` does not spell out (`FOR_ITER_EXIT_SKIPS`). Does not own what
instructions do (the opcode modules), nor the call-stack layout (call_stack.py).
"""

from __future__ import annotations

import dis
import sys
import types
from dataclasses import dataclass
from typing import Any

_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)

# What an exhausted FOR_ITER jumps over: `dis` reports the jump target as the loop's END_FOR,
# but CPython pops the iterator itself and resumes after these instructions (Python/bytecodes.c,
# FOR_ITER: 3.12 `JUMPBY(oparg + 1)`, 3.13 `JUMPBY(oparg + 2)`; 3.11 has no END_FOR).
_FOR_ITER_EXIT_SKIPS: dict[tuple[int, int], tuple[str, ...]] = {
    (3, 11): (),
    (3, 12): ("END_FOR",),
    (3, 13): ("END_FOR", "POP_TOP"),
}
FOR_ITER_EXIT_SKIPS = _FOR_ITER_EXIT_SKIPS.get(sys.version_info[:2], ())


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

"""The instruction model of the assembler.

Owns `Inst` (one real instruction: opcode name, argument, jump target as another `Inst`, source
positions, the exception handler covering it) and `ExnHandler` (an exception-table entry's
target, stack depth and lasti flag). EXTENDED_ARG prefixes and CACHE entries are not
instructions here: the assembler derives them. Does not own encoding (assemble.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional


class Positions(NamedTuple):
    """Source location of an instruction, as `code.co_positions()` yields it (None: unknown)."""
    lineno: Optional[int] = None
    end_lineno: Optional[int] = None
    col_offset: Optional[int] = None
    end_col_offset: Optional[int] = None


NO_POSITIONS = Positions()

_UNSET = object()


@dataclass(eq=False)
class ExnHandler:
    """Exception-table entry covering an instruction: on an exception, pop the stack to
    `depth`, push the offset of the raising instruction when `lasti`, push the exception, and
    jump to `target`."""
    target: "Inst"
    depth: int
    lasti: bool


@dataclass(eq=False)
class Inst:
    """One instruction. Identity matters (jump targets and handlers refer to instructions), so
    instances compare by identity.

    `arg`: the raw oparg (None for opcodes without an argument; computed by the assembler for
    jumps). `argval`: what the argument means (a constant, a name, a jump target's offset)
    when decoded, or, for a built instruction with `arg` None, the value the assembler turns
    into an index (see `CodeBuilder`). `target`: the instruction a jump goes to."""
    opname: str
    arg: Optional[int] = None
    argval: Any = _UNSET
    target: Optional["Inst"] = None
    positions: Positions = NO_POSITIONS
    exn: Optional[ExnHandler] = None
    offset: Optional[int] = None  # byte offset in the code it was decoded from (informational)

    @property
    def lineno(self) -> Optional[int]:
        return self.positions.lineno

    def __repr__(self) -> str:
        a = "" if self.arg is None else f" {self.arg}"
        v = "" if self.argval is _UNSET else f" ({self.argval!r})"
        t = "" if self.target is None else f" -> {self.target.opname}@{self.target.offset}"
        return f"Inst({self.opname}{a}{v}{t})"


def has_argval(inst: Inst) -> bool:
    return inst.argval is not _UNSET

"""The location table (`co_linetable`) of CPython 3.11+: encoding `(positions, size)` runs.

Format (CPython's Objects/locations.md): entries of 1 to 8 code units; first byte
`0x80 | code << 3 | (units - 1)`. Codes: 15 no location; 14 long form (signed line delta,
end-line delta, column + 1, end column + 1 as varints); 13 line only (signed line delta);
10-12 one line (line delta code - 10, column byte, end column byte); 0-9 short form (same
line, column < 80, width < 16). The encoder makes the same choices as CPython's assembler,
so a decoded code object re-encodes to the same bytes. Decoding is `code.co_positions()`.
3.11 writes one entry (or more) per instruction; 3.12+ merges equal neighbours.
"""

from __future__ import annotations

from .instruction import Positions
from .opinfo import VERSION

# 3.11's assembler writes one entry per instruction; 3.12+ merges runs of equal locations.
_MERGE = VERSION >= (3, 12)


def _varint(out: bytearray, value: int) -> None:
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)


def _svarint(out: bytearray, value: int) -> None:
    _varint(out, (-value << 1) | 1 if value < 0 else value << 1)


def _entry(out: bytearray, pos: Positions | None, units: int, state: list[int]) -> None:
    """One entry of at most 8 units; state[0] is the running line number."""
    head = 0x80 | (units - 1)
    if pos is None or pos.lineno is None:
        out.append(head | (15 << 3))
        return
    line, end_line = pos.lineno, pos.end_lineno
    col = -1 if pos.col_offset is None else pos.col_offset
    end_col = -1 if pos.end_col_offset is None else pos.end_col_offset
    delta = line - state[0]
    if col < 0 or end_col < 0:
        if end_line is None or end_line == line:
            out.append(head | (13 << 3))
            _svarint(out, delta)
            state[0] = line
            return
    elif end_line == line:
        if delta == 0 and col < 80 and 0 <= end_col - col < 16:
            out.append(head | ((col // 8) << 3))
            out.append(((col % 8) << 4) | (end_col - col))
            return
        if 0 <= delta < 3 and col < 128 and end_col < 128:
            out.append(head | ((10 + delta) << 3))
            out.append(col)
            out.append(end_col)
            state[0] = line
            return
    out.append(head | (14 << 3))
    _svarint(out, delta)
    _varint(out, (line if end_line is None else end_line) - line)
    _varint(out, col + 1)
    _varint(out, end_col + 1)
    state[0] = line


def encode(runs: list[tuple[Positions | None, int]], firstlineno: int) -> bytes:
    """`runs`: (positions, size in code units) per instruction, in order. On 3.12+
    consecutive equal positions are merged, as CPython's assembler does."""
    merged: list[list] = []
    for pos, size in runs:
        if pos is not None and pos.lineno is None:
            pos = None
        if _MERGE and merged and merged[-1][0] == pos:
            merged[-1][1] += size
        elif size:
            merged.append([pos, size])
    out = bytearray()
    state = [firstlineno]
    for pos, size in merged:
        while size > 8:
            _entry(out, pos, 8, state)
            size -= 8
        if size:
            _entry(out, pos, size, state)
    return bytes(out)

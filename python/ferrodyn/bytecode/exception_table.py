"""The exception table (`co_exceptiontable`) of CPython 3.11+: parsing and encoding.

Format (CPython's Objects/exception_handling_notes.txt): a sequence of entries
`(start, length, target, depth << 1 | lasti)`, all in code units, each field a big-endian
varint of 6-bit groups (0x40: more groups follow), the first byte of each entry marked with
0x80. Owns only the byte format; which instruction a range covers is assemble.py's and
decode.py's business.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple


class ExnEntry(NamedTuple):
    start: int   # first code unit covered
    end: int     # first code unit not covered
    target: int  # code unit of the handler
    depth: int
    lasti: bool


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    b = data[pos]
    value = b & 63
    pos += 1
    while b & 64:
        b = data[pos]
        pos += 1
        value = (value << 6) | (b & 63)
    return value, pos


def parse(data: bytes) -> list[ExnEntry]:
    entries = []
    pos = 0
    while pos < len(data):
        if not data[pos] & 0x80:
            raise ValueError(f"exception table: entry at byte {pos} lacks its start mark")
        start, pos = _read_varint(data, pos)
        length, pos = _read_varint(data, pos)
        target, pos = _read_varint(data, pos)
        dl, pos = _read_varint(data, pos)
        entries.append(ExnEntry(start, start + length, target, dl >> 1, bool(dl & 1)))
    return entries


def _write_varint(out: bytearray, value: int, mark: int = 0) -> None:
    if value < 0:
        raise ValueError(f"exception table: negative field {value}")
    groups = [value & 63]
    value >>= 6
    while value:
        groups.append(value & 63)
        value >>= 6
    groups.reverse()
    for i, g in enumerate(groups):
        if i < len(groups) - 1:
            g |= 64
        if i == 0:
            g |= mark
        out.append(g)


def encode(entries: list[ExnEntry]) -> bytes:
    out = bytearray()
    for e in entries:
        if e.end <= e.start:
            raise ValueError(f"exception table: empty range {e}")
        _write_varint(out, e.start, 0x80)
        _write_varint(out, e.end - e.start)
        _write_varint(out, e.target)
        _write_varint(out, (e.depth << 1) | int(e.lasti))
    return bytes(out)


def iter_units(entries: list[ExnEntry]) -> Iterator[tuple[int, ExnEntry]]:
    for e in entries:
        for u in range(e.start, e.end):
            yield u, e

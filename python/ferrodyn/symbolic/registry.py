"""Registration of opcode handlers by name, with the Python versions each applies to.

Owns `opcode(...)` (the decorator every handler uses: the function's name is the opcode's
name, the version range is inclusive and runs to the newest supported minor unless a handler
says otherwise, and the handler's docstring gets a link to the `dis` documentation), the
handler table, `handler_for(name)`, and `SUPPORTED_VERSIONS`. An opcode whose meaning changed
between minors has one handler per range (e.g. `END_FOR` until 3.12 and from 3.13); where only
the call-stack layout changed, the handler is shared and asks call_stack.py. The explicit table of unsupported
opcodes lives in opcodes_unsupported.py. tests/test_opcode_coverage.py checks that every opcode
of the running Python is handled or listed unsupported.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

DOCS_URL = "https://docs.python.org/{major}.{minor}/library/dis.html#opcode-{name}"
SUPPORTED_VERSIONS = ((3, 11), (3, 12), (3, 13))
OLDEST, NEWEST = SUPPORTED_VERSIONS[0], SUPPORTED_VERSIONS[-1]


@dataclass(frozen=True)
class OpcodeHandler:
    name: str
    fn: Callable
    since: tuple[int, int]
    until: tuple[int, int]

    def applies(self, version: tuple[int, int]) -> bool:
        return self.since <= version <= self.until

    def doc_url(self, version: tuple[int, int] | None = None) -> str:
        major, minor = version or self.since
        return DOCS_URL.format(major=major, minor=minor, name=self.name)


HANDLERS: dict[str, list[OpcodeHandler]] = {}


def opcode(since: tuple[int, int] = OLDEST, until: tuple[int, int] = NEWEST):
    """Register the decorated function as the handler of the opcode it is named after."""
    def deco(fn: Callable) -> Callable:
        h = OpcodeHandler(fn.__name__, fn, since, until)
        HANDLERS.setdefault(h.name, []).append(h)
        fn.__doc__ = (fn.__doc__ or "").rstrip() + f"\n\n    See {h.doc_url()}\n"
        return fn
    return deco


def handler_for(name: str, version: tuple[int, int] | None = None) -> Callable | None:
    version = version or sys.version_info[:2]
    for h in HANDLERS.get(name, ()):
        if h.applies(version):
            return h.fn
    return None


def handled_names(version: tuple[int, int] | None = None) -> set[str]:
    version = version or sys.version_info[:2]
    return {name for name, hs in HANDLERS.items() if any(h.applies(version) for h in hs)}

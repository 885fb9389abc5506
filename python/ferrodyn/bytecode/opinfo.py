"""Per-version opcode facts the assembler needs, read from the running interpreter's `dis` and
`opcode` modules: opcode numbers, inline cache sizes, which opcodes jump (and backwards),
which end a basic block, and what kind of table index an opcode's argument is.

Owns no encoding logic. Everything is computed once at import for `sys.version_info`.
"""

from __future__ import annotations

import dis
import opcode as _opcode
import sys

VERSION = sys.version_info[:2]
if not (3, 11) <= VERSION <= (3, 13):
    raise ImportError(f"ferrodyn.bytecode supports CPython 3.11 to 3.13, not {VERSION}")

OPMAP: dict[str, int] = dict(dis.opmap)
OPNAME: dict[int, str] = {v: k for k, v in OPMAP.items()}
EXTENDED_ARG = OPMAP["EXTENDED_ARG"]
CACHE = OPMAP["CACHE"]
HAVE_ARGUMENT = dis.HAVE_ARGUMENT


def _cache_sizes() -> dict[str, int]:
    table = dis._inline_cache_entries  # list by opcode (3.11, 3.12) or dict by name (3.13)
    if isinstance(table, dict):
        return {name: table.get(name, 0) for name in OPMAP}
    return {name: table[op] if op < len(table) else 0 for name, op in OPMAP.items()}


CACHE_SIZE: dict[str, int] = _cache_sizes()

JUMPS: frozenset[str] = frozenset(OPNAME[o] for o in (*dis.hasjrel, *dis.hasjabs) if o in OPNAME)
BACKWARD_JUMPS: frozenset[str] = frozenset(n for n in JUMPS if "BACKWARD" in n)
UNCONDITIONAL_JUMPS = frozenset({"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"})
TERMINATORS = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"})

# 3.11 spells the direction of a conditional jump in its name; the assembler picks it.
_DIRECTIONAL = {}
if VERSION == (3, 11):
    for _cond in ("TRUE", "FALSE", "NONE", "NOT_NONE"):
        _DIRECTIONAL[f"POP_JUMP_FORWARD_IF_{_cond}"] = (f"POP_JUMP_FORWARD_IF_{_cond}",
                                                        f"POP_JUMP_BACKWARD_IF_{_cond}")
        _DIRECTIONAL[f"POP_JUMP_BACKWARD_IF_{_cond}"] = _DIRECTIONAL[f"POP_JUMP_FORWARD_IF_{_cond}"]
        _DIRECTIONAL[f"POP_JUMP_IF_{_cond}"] = _DIRECTIONAL[f"POP_JUMP_FORWARD_IF_{_cond}"]
_DIRECTIONAL["JUMP_FORWARD"] = ("JUMP_FORWARD", "JUMP_BACKWARD")
_DIRECTIONAL["JUMP_BACKWARD"] = ("JUMP_FORWARD", "JUMP_BACKWARD")
_DIRECTIONAL["JUMP"] = ("JUMP_FORWARD", "JUMP_BACKWARD")  # a direction-free jump for builders


def jump_opname(name: str, backward: bool) -> str:
    """The concrete opcode for a jump of kind `name` going forwards or backwards."""
    pair = _DIRECTIONAL.get(name)
    if pair is None:
        if backward != (name in BACKWARD_JUMPS):
            raise ValueError(f"{name} cannot jump {'back' if backward else 'forward'}wards")
        return name
    return pair[backward]


def is_jump(name: str) -> bool:
    return name in JUMPS or name in _DIRECTIONAL


# Which table an opcode's argument indexes (for building instructions from values).
CONST_OPS = frozenset(OPNAME[o] for o in dis.hasconst if o in OPNAME)
NAME_OPS = frozenset(OPNAME[o] for o in dis.hasname if o in OPNAME)
LOCAL_OPS = frozenset(OPNAME[o] for o in dis.haslocal if o in OPNAME)
FREE_OPS = frozenset(OPNAME[o] for o in dis.hasfree if o in OPNAME)


def stack_effect(name: str, arg: int | None, jump: bool) -> int:
    if name == "RETURN_GENERATOR":
        return 1  # the frame resumes with the value sent in (dis says 0: it counts the return)
    op = OPMAP[name]
    if op < HAVE_ARGUMENT:
        arg = None
    elif arg is None:
        arg = 0
    return dis.stack_effect(op, arg, jump=jump)

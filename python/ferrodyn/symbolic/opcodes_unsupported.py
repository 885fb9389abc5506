"""The explicit list of opcodes the translator does not trace, with the reason for each.

Owns `UNSUPPORTED` (opcode name -> (BreakReason, note, first version, last version)) and
`refuse(inst)`, which raises Unsupported for them (and for anything unknown). Coverage is
visible at a glance: tests/test_opcode_coverage.py asserts that every opcode of the running
Python is either handled (registry.py) or listed here, never both.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

from ferrodyn.exc import BreakReason
from ferrodyn.symbolic.registry import NEWEST, OLDEST
from ferrodyn.variables.base import unsupported


class Refusal(NamedTuple):
    reason: BreakReason
    note: str
    since: tuple[int, int] = OLDEST
    until: tuple[int, int] = NEWEST


_EXC = BreakReason.EXCEPTION
_GEN = BreakReason.GENERATOR
_SIDE = BreakReason.SIDE_EFFECT
_OP = BreakReason.UNSUPPORTED_OPCODE
_V311 = {"until": (3, 11)}
_V312 = {"since": (3, 12)}
_V313 = {"since": (3, 13)}

UNSUPPORTED: dict[str, Refusal] = {
    # exceptions (raising, handling; the exceptional half of `with`)
    "CHECK_EG_MATCH": Refusal(_EXC, "except* clause"),
    "PREP_RERAISE_STAR": Refusal(_EXC, "except* clause", **_V311),
    "CALL_INTRINSIC_2": Refusal(_EXC, "except* / type parameters", **_V312),
    # generators, coroutines, async
    "GET_AWAITABLE": Refusal(_GEN, "await"),
    "GET_AITER": Refusal(_GEN, "async for"),
    "GET_ANEXT": Refusal(_GEN, "async for"),
    "END_ASYNC_FOR": Refusal(_GEN, "async for"),
    "BEFORE_ASYNC_WITH": Refusal(_GEN, "async with"),
    "ASYNC_GEN_WRAP": Refusal(_GEN, "async generator", **_V311),
    # stores that escape the frame
    "DELETE_DEREF": Refusal(_SIDE, "deletion of a closure variable"),
    "IMPORT_STAR": Refusal(_SIDE, "from m import *", **_V311),
    # module / class bodies (never a traced function frame)
    "LOAD_NAME": Refusal(_OP, "module/class-body name lookup"),
    "STORE_NAME": Refusal(_OP, "module/class-body name store"),
    "DELETE_NAME": Refusal(_OP, "module/class-body name deletion"),
    "LOAD_CLASSDEREF": Refusal(_OP, "class-body closure lookup", **_V311),
    "LOAD_LOCALS": Refusal(_OP, "class body / type parameters", **_V312),
    "LOAD_FROM_DICT_OR_DEREF": Refusal(_OP, "class body / type parameters", **_V312),
    "LOAD_FROM_DICT_OR_GLOBALS": Refusal(_OP, "class body / type parameters", **_V312),
    "LOAD_BUILD_CLASS": Refusal(_OP, "class statement"),
    "SETUP_ANNOTATIONS": Refusal(_OP, "module/class annotations"),
    "PRINT_EXPR": Refusal(_OP, "interactive-mode expression", **_V311),
    # structural pattern matching
    "MATCH_CLASS": Refusal(_OP, "match statement"),
    "MATCH_KEYS": Refusal(_OP, "match statement"),
    "MATCH_MAPPING": Refusal(_OP, "match statement"),
    "MATCH_SEQUENCE": Refusal(_OP, "match statement"),
    # 3.12 pseudo-instructions (compiler-internal, never in a code object)
    **{name: Refusal(_OP, "pseudo-instruction", **_V312) for name in (
        "JUMP", "JUMP_NO_INTERRUPT", "POP_BLOCK", "SETUP_CLEANUP", "SETUP_FINALLY",
        "SETUP_WITH", "LOAD_METHOD", "LOAD_SUPER_METHOD", "LOAD_ZERO_SUPER_ATTR",
        "LOAD_ZERO_SUPER_METHOD", "STORE_FAST_MAYBE_NULL")},
    # 3.13: LOAD_CLOSURE became a pseudo-instruction (emitted as LOAD_FAST of the cell's slot)
    "LOAD_CLOSURE": Refusal(_OP, "pseudo-instruction", **_V313),
    # 3.12 interpreter-internal and sys.monitoring instrumentation
    "INTERPRETER_EXIT": Refusal(_OP, "interpreter-internal", **_V312),
    "RESERVED": Refusal(_OP, "interpreter-internal", **_V312),
    "ENTER_EXECUTOR": Refusal(_OP, "interpreter-internal (tier-2 executor)", **_V313),
    "EXIT_INIT_CHECK": Refusal(_OP, "interpreter-internal (__init__ shim frame)", **_V313),
    "INSTRUMENTED_CALL_KW": Refusal(_OP, "sys.monitoring instrumentation", **_V313),
    **{name: Refusal(_OP, "sys.monitoring instrumentation", **_V312) for name in (
        "INSTRUMENTED_CALL", "INSTRUMENTED_CALL_FUNCTION_EX", "INSTRUMENTED_END_FOR",
        "INSTRUMENTED_END_SEND", "INSTRUMENTED_FOR_ITER", "INSTRUMENTED_INSTRUCTION",
        "INSTRUMENTED_JUMP_BACKWARD", "INSTRUMENTED_JUMP_FORWARD", "INSTRUMENTED_LINE",
        "INSTRUMENTED_LOAD_SUPER_ATTR", "INSTRUMENTED_POP_JUMP_IF_FALSE",
        "INSTRUMENTED_POP_JUMP_IF_NONE", "INSTRUMENTED_POP_JUMP_IF_NOT_NONE",
        "INSTRUMENTED_POP_JUMP_IF_TRUE", "INSTRUMENTED_RESUME", "INSTRUMENTED_RETURN_CONST",
        "INSTRUMENTED_RETURN_VALUE", "INSTRUMENTED_YIELD_VALUE")},
}


def unsupported_names(version: tuple[int, int] | None = None) -> set[str]:
    version = version or sys.version_info[:2]
    return {n for n, r in UNSUPPORTED.items() if r.since <= version <= r.until}


def refuse(inst) -> None:
    r = UNSUPPORTED.get(inst.opname)
    if r is None:
        unsupported(f"opcode {inst.opname}", BreakReason.UNSUPPORTED_OPCODE)
    unsupported(f"{r.note} ({inst.opname})", r.reason)

"""Stack depth of an instruction list: the `co_stacksize` CPython would compute.

Owns a forward data-flow over the instructions (fall-through, jump targets, exception
handlers entered at `depth + 1 + lasti`), using `dis.stack_effect` per edge. Raises
ValueError on inconsistent depths (two paths reaching an instruction with different depths)
or a negative depth: the instruction list is malformed.
"""

from __future__ import annotations

from .instruction import Inst
from .opinfo import TERMINATORS, UNCONDITIONAL_JUMPS, is_jump, stack_effect


def stack_depths(insts: list[Inst], names: list[str] | None = None,
                 args: list[int | None] | None = None) -> tuple[int, list]:
    """(max depth, depth at entry of each instruction; None where unreachable). `names` and
    `args`: the resolved opcode names and arguments (jumps), when not those of `insts`."""
    index = {id(i): n for n, i in enumerate(insts)}
    depth: list[int | None] = [None] * len(insts)
    best = 0
    work: list[tuple[int, int]] = [(0, 0)] if insts else []

    def reach(n: int, d: int, why: Inst) -> None:
        nonlocal best
        if d < 0:
            raise ValueError(f"stack underflow reaching instruction {n} from {why!r}")
        best = max(best, d)
        if depth[n] is None:
            depth[n] = d
            work.append((n, d))
        elif depth[n] != d:
            raise ValueError(f"inconsistent stack depth at instruction {n} ({insts[n]!r}): "
                             f"{depth[n]} and {d} (from {why!r})")

    while work:
        n, d = work.pop()
        inst = insts[n]
        name = inst.opname if names is None else names[n]
        arg = inst.arg if args is None else args[n]
        if inst.exn is not None:
            reach(index[id(inst.exn.target)], inst.exn.depth + 1 + int(inst.exn.lasti), inst)
        if inst.target is not None and is_jump(name):
            reach(index[id(inst.target)], d + stack_effect(name, arg or 0, True), inst)
            if name in UNCONDITIONAL_JUMPS:
                continue
        if name in TERMINATORS:
            continue
        if n + 1 < len(insts):
            reach(n + 1, d + stack_effect(name, arg, False), inst)
    return best, depth

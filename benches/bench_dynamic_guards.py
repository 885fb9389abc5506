"""Symbolic-shape guards (group "dynamic_guards"): a cache hit on an entry compiled with
`dynamic=True`, ferrodyn against torch.compile on the same function and inputs.

Rows: the guard check alone (ferrodyn's GuardTree of its real entry -- tensor_match with the
dynamic dims left out plus the ShapeEnv's guards as Rust expression leaves -- on the argument
slots, against torch's `guard_manager.check` of its own dynamic entry on f_locals), and the
whole compiled call on a cache hit (both with the "eager" backend), on a size neither saw when
compiling.
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from timing import interleaved_ns  # noqa: E402

import ferrodyn  # noqa: E402
from ferrodyn import _C  # noqa: E402

GROUP = "dynamic_guards"


def attention_step(q, k, v, n):
    att = (q @ k.transpose(-1, -2)).softmax(-1)
    return att @ v * n


def _inputs(length: int):
    return (torch.randn(2, 1, 8), torch.randn(2, length, 8), torch.randn(2, length, 8), length)


def run(rounds: int = 200) -> list[dict]:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    code = attention_step.__code__
    ferrodyn.reset()
    torch._dynamo.reset()
    ours = ferrodyn.compile(attention_step, backend="eager", dynamic=True)
    theirs = torch.compile(attention_step, backend="eager", dynamic=True)
    ours(*_inputs(5))
    theirs(*_inputs(5))
    args = _inputs(9)  # a hit on the symbolic entry, not the compile-time sizes
    torch.testing.assert_close(ours(*args), theirs(*args))
    entries = _C.cache_entries(code)
    assert len(entries) == 1 and any("<=" in g or "==" in g for g in entries[0].guards.leaves())
    tree = entries[0].guards
    gm = _debug_get_cache_entry_list(code)[0].guard_manager
    f_locals = dict(zip(code.co_varnames, args))
    assert tree.check(args) and gm.check(f_locals)
    ref = "torch guard_manager.check"
    t = interleaved_ns({"torch": lambda: gm.check(f_locals), "ferrodyn": lambda: tree.check(args)},
                       inner=200, rounds=rounds)
    rows = [{"case": f"guards of a dynamic entry ({len(tree)} leaves), slots",
             "ferrodyn": t["ferrodyn"], "reference": t["torch"], "unit": "ns",
             "reference_name": ref}]
    c = interleaved_ns({"torch": lambda: theirs(*args), "ferrodyn": lambda: ours(*args)},
                       inner=20, rounds=max(rounds // 4, 10))
    rows.append({"case": "cache-hit call on a dynamic entry (eager backend)",
                 "ferrodyn": c["ferrodyn"], "reference": c["torch"], "unit": "ns",
                 "reference_name": "torch.compile call"})
    ferrodyn.reset()
    torch._dynamo.reset()
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)

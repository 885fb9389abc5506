"""Benchmark group "hook": what ferrodyn's PEP 523 hook costs, against TorchDynamo's C hook in
the same process.

Cases:
- "run-only, no entries (3-frame chain)": a chain of three small Python functions called with
  the thread's callback set to False (run cached entries only) and no entries for them, i.e.
  the hook's cost on frames it does not compile. Reference: torch's own run-only mode
  (`torch._C._dynamo.eval_frame.set_eval_frame(False)`), same chain. Eager (no hook) is in the
  note.
- "set_eval_frame(cb) + restore": the per-call cost of entering and leaving the hook from a
  wrapper, against torch's `set_eval_frame`.
- "cache hit, 1 tensor arg": `f(x)` whose cache holds one entry running the same fx graph
  (captured from torch.compile(backend="eager")), guarded by the equivalent tree (tensor match
  on x and the global torch state), called in run-only mode: hook + lookup + guard + entry call.
  Reference: the same call under torch's run-only mode hitting torch's cache entry for f
  (its C hook, guard manager and transformed bytecode).
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from timing import interleaved_ns  # noqa: E402

GROUP = "hook"
CALLS = 2000  # calls per timed block (hook switched on/off around each block)


def c(x):
    return x + 1


def b(x):
    return c(x) * 2


def a(x):
    return b(x) - 1


def f(x):
    return x + 1


def g(x):
    return x


def g_entry(x):
    return x


def _block(set_mode, fn, arg, n=CALLS):
    def run():
        prev = set_mode(False)
        try:
            for _ in range(n):
                fn(arg)
        finally:
            set_mode(prev)
    return run


def _plain(fn, arg, n=CALLS):
    def run():
        for _ in range(n):
            fn(arg)
    return run


def run(rounds: int = 30) -> list[dict]:
    import torch
    import torch._dynamo
    from torch._C._dynamo import eval_frame as torch_ef

    from ferrodyn import _C

    # One intra-op thread: on a small shared machine torch's thread pool makes the tensor case's
    # timings mostly scheduler noise. Restored on exit.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(rounds, torch, torch_ef, _C)
    finally:
        torch.set_num_threads(threads)


def _run(rounds, torch, torch_ef, _C) -> list[dict]:
    import torch._dynamo

    rows = []
    t = interleaved_ns({
        "ferrodyn": _block(_C.set_eval_frame, a, 3),
        "torch": _block(torch_ef.set_eval_frame, a, 3),
        "plain": _plain(a, 3),
    }, inner=1, rounds=rounds)
    t = {k: v / CALLS for k, v in t.items()}
    rows.append({
        "case": "run-only, no entries (3-frame chain)",
        "ferrodyn": t["ferrodyn"], "reference": t["torch"], "unit": "ns",
        "reference_name": "torch._dynamo",
        "note": f"eager (no hook): {t['plain']:.0f} ns per call",
    })

    # What a compiled function's wrapper pays to enter and leave the hook: set a callback,
    # restore the previous one (None).
    def toggles(set_eval_frame, n=CALLS):
        cb = lambda view: None  # noqa: E731

        def run():
            for _ in range(n):
                set_eval_frame(set_eval_frame(cb))
        return run

    t = interleaved_ns({"ferrodyn": toggles(_C.set_eval_frame),
                        "torch": toggles(torch_ef.set_eval_frame)}, inner=1, rounds=rounds)
    rows.append({
        "case": "set_eval_frame(cb) + restore (None)",
        "ferrodyn": t["ferrodyn"] / CALLS, "reference": t["torch"] / CALLS, "unit": "ns",
        "reference_name": "torch._dynamo",
        "note": "the two calls a compiled function's wrapper makes per call",
    })

    # Cache hit: the same fx graph behind both caches.
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    x = torch.randn(8)
    compiled = torch.compile(f, backend=recording_backend)
    compiled(x)
    compiled(x)
    (gm,) = graphs

    fwd = gm.forward  # what torch's transformed bytecode calls

    def entry_fn(x):
        return fwd(x)[0]

    bld = _C.GuardBuilder()
    bld.tensor_match(bld.local(0, "x"), x)
    bld.global_state()
    _C.reset()
    _C.insert_entry(f.__code__, _C.CacheEntry(entry_fn, bld.build()))
    assert torch.equal(_block(_C.set_eval_frame, f, x, 1)() or f(x), f(x))
    t = interleaved_ns({
        "ferrodyn": _block(_C.set_eval_frame, f, x),
        "torch": _block(torch_ef.set_eval_frame, f, x),
        "plain": _plain(f, x),
    }, inner=1, rounds=rounds)
    t = {k: v / CALLS for k, v in t.items()}
    hits = _C.cache_entries(f.__code__)[0].hits
    rows.append({
        "case": "cache hit, 1 tensor arg (same fx graph)",
        "ferrodyn": t["ferrodyn"], "reference": t["torch"], "unit": "ns",
        "reference_name": "torch._dynamo",
        "note": f"eager: {t['plain']:.0f} ns; ferrodyn entry hits: {hits}",
    })

    # Dispatch alone: a hit on an entry with an empty tree whose function is as cheap as the
    # original (no torch counterpart without a graph; reported as a note).
    _C.reset()
    _C.insert_entry(g.__code__, _C.CacheEntry(g_entry, _C.GuardBuilder().build()))
    t = interleaved_ns({
        "hit": _block(_C.set_eval_frame, g, 1),
        "plain": _plain(g, 1),
    }, inner=1, rounds=rounds)
    rows[-1]["note"] += (f"; trivial entry hit: {t['hit'] / CALLS:.0f} ns vs plain call "
                         f"{t['plain'] / CALLS:.0f} ns")
    _C.reset()
    torch._dynamo.reset()
    return rows


if __name__ == "__main__":
    for r in run():
        print(f"{r['case']}: ferrodyn {r['ferrodyn']:.0f} ns, torch {r['reference']:.0f} ns, "
              f"ratio {r['ferrodyn'] / r['reference']:.3f}  ({r['note']})")

"""Cache-hit call overhead: (compiled call - calling the captured graph) and (compiled call -
eager call) for a function of 1, 4, 16 and 64 tensor arguments (one `torch.cat` of them all,
so every argument is a graph input and guarded; the graph baseline is the fx `forward` ferrodyn
captured, called directly, as for modules: the issue's "cost over calling the captured
graph"), hits on
the 1st and the 8th of 8 entries, and, for modules (one parameter; an 8-layer MLP with 16
parameters), (compiled call - calling the captured fx graph), ferrodyn vs torch.compile, both
with backend="eager" (ferrodyn's module cases: a backend that returns gm.forward, the same). Rounds alternate eager / ferrodyn / torch.compile;
the overhead is the median over rounds of (compiled - eager) measured in the same round. Times
are this thread's CPU time (time.thread_time_ns), not wall time: on a shared, oversubscribed
machine wall time mostly measures the other processes. One intra-op thread, as tiny tensors
want."""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

GROUP = "overhead"


def make_fn(n: int):
    """A function of n tensors whose graph is one op over all of them (`torch.cat`; `a0 + 1`
    for one): every argument is a graph input and guarded, and the graph's own work stays
    small, so the overhead is not a difference of two long runs of ops (with 63 additions
    the run-to-run spread of the graph alone, about 3 us, was larger than ferrodyn's
    overhead)."""
    params = ", ".join(f"a{i}" for i in range(n))
    body = f"torch.cat(({params},))" if n > 1 else "a0 + 1"
    ns: dict = {"torch": torch}
    exec(f"def add_{n}({params}):\n    return {body}\n", ns)
    return ns[f"add_{n}"]


def paired_overhead_ns(eager, compiled: dict, inner: int, rounds: int) -> dict:
    """Median over rounds of (compiled - eager) ns per call, each pair timed in the same round."""
    diffs = {k: [] for k in compiled}
    base = []

    def once(f):
        t0 = time.thread_time_ns()
        for _ in range(inner):
            f()
        return (time.thread_time_ns() - t0) / inner

    for _ in range(rounds):
        e = once(eager)
        base.append(e)
        for k, f in compiled.items():
            diffs[k].append(once(f) - e)
    out = {k: statistics.median(v) for k, v in diffs.items()}
    out["eager"] = statistics.median(base)
    return out


def run(rounds: int = 60) -> list[dict]:
    import torch._dynamo

    import ferrodyn

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(rounds, ferrodyn, torch._dynamo)
    finally:
        torch.set_num_threads(threads)


def _run(rounds, ferrodyn, dynamo) -> list[dict]:
    rows = []
    for n in (1, 4, 16, 64):
        fn = make_fn(n)
        args = [torch.randn(4) for _ in range(n)]
        ferrodyn.reset()
        dynamo.reset()
        grabbed = []

        def grab(gm, example_inputs, grabbed=grabbed):
            grabbed.append(gm.forward)
            return gm.forward

        fd = ferrodyn.compile(fn, backend=grab)
        tc = torch.compile(fn, backend="eager")
        for f in (fd, tc):  # compile, then one hit
            f(*args)
            f(*args)
        assert torch.allclose(fd(*args), fn(*args)) and len(grabbed) == 1
        entries = ferrodyn._C.cache_entries(fn.__code__)
        captured = bool(entries) and entries[0].hits > 0
        compiled = {"ferrodyn": lambda: fd(*args), "torch": lambda: tc(*args)}
        case = f"{n} tensor args" + ("" if captured else " [ferrodyn ran eagerly]")
        # over calling the captured graph (the issue's "cost over calling the captured
        # graph"), then over the eager function (the graph's own fx frame counted as overhead)
        graph = grabbed[0]
        t = paired_overhead_ns(lambda: graph(*args), compiled, inner=200, rounds=rounds)
        rows.append({"case": f"{case}, over the graph", "ferrodyn": t["ferrodyn"] / 1e3,
                     "reference": t["torch"] / 1e3, "unit": "us", "reference_name": "torch.compile",
                     "graph_us": t["eager"] / 1e3})
        t = paired_overhead_ns(lambda: fn(*args), compiled, inner=200, rounds=rounds)
        rows.append({"case": f"{case}, over eager", "ferrodyn": t["ferrodyn"] / 1e3, "reference": t["torch"] / 1e3,
                     "unit": "us", "reference_name": "torch.compile", "eager_us": t["eager"] / 1e3})
    # 8 entries of one code (8 input shapes). "entry 1": the same input every call (its entry
    # is the most recently hit, first). "entry 8": inputs in the order that makes every call
    # hit the last entry of the list (each hit moves its entry to the front, in both). Both
    # with dynamic=False (torch would otherwise make the size dynamic: one entry).
    fn = make_fn(1)
    xs = [torch.randn(k + 1) for k in range(8)]
    ferrodyn.reset()
    dynamo.reset()
    fd = ferrodyn.compile(fn, backend="eager", dynamic=False)
    tc = torch.compile(fn, backend="eager", dynamic=False)
    for f in (fd, tc):
        for x in xs:
            f(x)
    entries = ferrodyn._C.cache_entries(fn.__code__)
    assert len(entries) == 8
    # entries[0] is xs[7]'s ... entries[7] is xs[0]'s: calling xs[0], xs[1], ... cyclically
    # always hits the last entry
    assert all(e.guards.check((x,), fn.__globals__) for e, x in zip(entries, reversed(xs)))
    order = {"entry 1": [xs[7]] * 8, "entry 8": list(xs)}
    for name, seq in order.items():
        def cycle(f, seq=seq):
            def run():
                for x in seq:
                    f(x)
            return run

        t = paired_overhead_ns(cycle(fn), {"ferrodyn": cycle(fd), "torch": cycle(tc)}, inner=25, rounds=rounds)
        rows.append({"case": f"1 tensor arg, 8 entries, hit on {name}", "ferrodyn": t["ferrodyn"] / 8e3,
                     "reference": t["torch"] / 8e3, "unit": "us", "reference_name": "torch.compile"})
    last = ferrodyn._C.cache_entries(fn.__code__)
    assert last[0].guards.check((xs[7],), fn.__globals__)  # the cycle ended on xs[7]
    # an nn.Module (one parameter): OptimizedModule vs torch.compile's OptimizedModule, over
    # calling the captured graph (the module's own eager call costs an nn.Module.__call__,
    # which the compiled call skips)
    mod = _Scale()
    x = torch.randn(4)
    ferrodyn.reset()
    dynamo.reset()
    grabbed = []

    def grab1(gm, example_inputs):
        grabbed.append((gm, list(example_inputs)))
        return gm.forward

    fd, tc = ferrodyn.compile(mod, backend=grab1), torch.compile(mod, backend="eager")
    with torch.no_grad():
        for f in (fd, tc):
            f(x)
            f(x)
        gm1, ex1 = grabbed[0]
        t = paired_overhead_ns(lambda: gm1.forward(*ex1), {"ferrodyn": lambda: fd(x), "torch": lambda: tc(x)},
                               inner=200, rounds=rounds)
    rows.append({"case": "nn.Module, 1 tensor arg", "ferrodyn": t["ferrodyn"] / 1e3,
                 "reference": t["torch"] / 1e3, "unit": "us", "reference_name": "torch.compile"})
    # an 8-layer MLP (16 parameters), no_grad: the per-parameter guard and entry cost. Its
    # baseline is calling the captured fx graph itself (eager nn.Module calls cost more than
    # the graph), as the "cost over calling the captured graph".
    from workloads import MLP

    mlp = MLP(width=8, depth=8)
    x = torch.randn(2, 8)
    ferrodyn.reset()
    dynamo.reset()
    captured = []

    def grab(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm.forward

    fd, tc = ferrodyn.compile(mlp, backend=grab), torch.compile(mlp, backend="eager")
    with torch.no_grad():
        for f in (fd, tc):
            f(x)
            f(x)
        assert torch.allclose(fd(x), mlp(x)) and len(captured) == 1
        gm, ex = captured[0]
        t = paired_overhead_ns(lambda: gm.forward(*ex), {"ferrodyn": lambda: fd(x), "torch": lambda: tc(x)},
                               inner=100, rounds=rounds)
    rows.append({"case": "8-layer MLP module (16 params), no_grad", "ferrodyn": t["ferrodyn"] / 1e3,
                 "reference": t["torch"] / 1e3, "unit": "us", "reference_name": "torch.compile",
                 "eager_us": t["eager"] / 1e3})
    ferrodyn.reset()
    dynamo.reset()
    return rows


class _Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.w


if __name__ == "__main__":
    for r in run():
        print(r)

"""Per-call overhead of a function with one graph break (two graphs and a resume function):
(compiled call - eager call), ferrodyn vs torch.compile, both backend="eager", measured like
bench_overhead (rounds alternate eager / ferrodyn / torch.compile; thread CPU time; one
intra-op thread). Cases: the break at `torch._dynamo.graph_break()` between two tensor ops,
a data-dependent `if` on a tensor (the entry chooses between two resume functions), and a
break inside a called helper (ferrodyn: two graphs, the root's resume function inlining the
helper's; torch.compile by default: three graphs and two resume functions).

Two rows per case: the overhead over calling ferrodyn's two captured graphs directly (the
issue's definition, "over calling the two graphs directly", as bench_overhead does for
modules: both compiled calls are compared against the same two `forward` calls; the
instruction run eagerly at the break, `bool()` of a tensor for the `if`, counts as overhead
for both), and the overhead over the eager function."""

from __future__ import annotations

import importlib.util
import pathlib

import torch

GROUP = "graph_break"


def _paired():
    path = pathlib.Path(__file__).with_name("bench_overhead.py")
    spec = importlib.util.spec_from_file_location("bench_overhead", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.paired_overhead_ns


def explicit_break(x, y):
    z = x * y + 1
    torch._dynamo.graph_break()
    return z.sin() + y


def tensor_if(x, y):
    z = x * y
    if z.sum() > 0:
        return z + 1
    return z - 1


def _helper(h):
    h = h.cos()
    torch._dynamo.graph_break()
    return h * 2


def nested_break(x, y):
    return _helper(x * y) + y


def run(rounds: int = 60) -> list[dict]:
    import torch._dynamo

    import ferrodyn

    paired = _paired()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for name, fn in (("graph_break() between two ops", explicit_break),
                         ("data-dependent if", tensor_if),
                         ("graph_break() in a helper (nested)", nested_break)):
            args = (torch.randn(4).abs(), torch.randn(4).abs())
            ferrodyn.reset()
            torch._dynamo.reset()
            grabbed = []

            def grab(gm, example_inputs, grabbed=grabbed):
                grabbed.append((gm.forward, list(example_inputs)))
                return gm.forward

            fd = ferrodyn.compile(fn, backend=grab)
            tc = torch.compile(fn, backend="eager")
            for f in (fd, tc):
                f(*args)
                f(*args)
            assert torch.allclose(fd(*args), fn(*args)) and len(grabbed) == 2
            (f1, a1), (f2, a2) = grabbed
            compiled = {"ferrodyn": lambda: fd(*args), "torch": lambda: tc(*args)}
            t = paired(lambda: (f1(*a1), f2(*a2)), compiled, inner=200, rounds=rounds)
            rows.append({"case": f"{name}, over its two graphs", "ferrodyn": t["ferrodyn"] / 1e3,
                         "reference": t["torch"] / 1e3, "unit": "us", "reference_name": "torch.compile",
                         "graphs_us": t["eager"] / 1e3})
            t = paired(lambda: fn(*args), compiled, inner=200, rounds=rounds)
            rows.append({"case": f"{name}, over eager", "ferrodyn": t["ferrodyn"] / 1e3,
                         "reference": t["torch"] / 1e3, "unit": "us", "reference_name": "torch.compile",
                         "eager_us": t["eager"] / 1e3})
    finally:
        torch.set_num_threads(threads)
        ferrodyn.reset()
        torch._dynamo.reset()
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)

"""Cache-hit call overhead: (compiled call - eager call) for a function of 1, 4, 16 and 64
tensor arguments (it adds them all, so every argument is a graph input and guarded), ferrodyn
vs torch.compile, both with backend="eager". Interleaved medians in one process."""

from __future__ import annotations

import torch

from timing import interleaved_ns

GROUP = "overhead"


def make_fn(n: int):
    params = ", ".join(f"a{i}" for i in range(n))
    body = " + ".join(f"a{i}" for i in range(n)) if n > 1 else "a0 + 1"
    ns: dict = {}
    exec(f"def add_{n}({params}):\n    return {body}\n", ns)
    return ns[f"add_{n}"]


def run(rounds: int = 40) -> list[dict]:
    import torch._dynamo

    import ferrodyn

    rows = []
    for n in (1, 4, 16, 64):
        fn = make_fn(n)
        args = [torch.randn(4) for _ in range(n)]
        ferrodyn.reset()
        torch._dynamo.reset()
        fd = ferrodyn.compile(fn, backend="eager")
        tc = torch.compile(fn, backend="eager")
        for f in (fd, tc):  # compile, then one hit
            f(*args)
            f(*args)
        assert torch.allclose(fd(*args), fn(*args))
        entries = ferrodyn._C.cache_entries(fn.__code__)
        captured = bool(entries) and entries[0].hits > 0
        t = interleaved_ns({"eager": lambda: fn(*args), "ferrodyn": lambda: fd(*args),
                            "torch": lambda: tc(*args)}, inner=200, rounds=rounds)
        case = f"{n} tensor args" + ("" if captured else " [ferrodyn ran eagerly]")
        rows.append({"case": case, "ferrodyn": (t["ferrodyn"] - t["eager"]) / 1e3,
                     "reference": (t["torch"] - t["eager"]) / 1e3, "unit": "us",
                     "reference_name": "torch.compile", "eager_us": t["eager"] / 1e3})
    ferrodyn.reset()
    torch._dynamo.reset()
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)

"""Weak dictionaries: ferrodyn.weak.WeakIdKeyDictionary against torch.utils.weak's, in ns per
operation, on tensor keys (what WeakTensorKeyDictionary holds in make_fx and fake tensors), and
for two cases on plain-object keys too.

Each case runs one operation over N keys per call; the two implementations alternate round by
round (timing.interleaved_ns), and cases that need untimed set-up (deleting, keys dying) use the
same alternation with the set-up outside the timed region.

    python benches/run.py --group weakdict
"""

from __future__ import annotations

import gc
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from timing import interleaved_ns  # noqa: E402

GROUP = "weakdict"
N = 1000


def _impls():
    import torch.utils.weak as tweak

    import ferrodyn.weak as fweak

    return {"ferrodyn": fweak.WeakIdKeyDictionary, "reference": tweak.WeakIdKeyDictionary}


def _interleaved_with_setup(setups: dict, rounds: int) -> dict:
    """Like timing.interleaved_ns, for `setup() -> timed_fn` pairs: set-up untimed, then one
    timed call. Returns {name: median ns per call}."""
    samples = {k: [] for k in setups}
    for _ in range(rounds):
        for k, setup in setups.items():
            fn = setup()
            t0 = time.perf_counter_ns()
            fn()
            samples[k].append(time.perf_counter_ns() - t0)
            del fn
    return {k: statistics.median(v) for k, v in samples.items()}


def run(rounds: int = 30) -> list[dict]:
    import torch

    impls = _impls()
    keys = [torch.randn(1) for _ in range(N)]
    misses = [torch.randn(1) for _ in range(N)]
    v = object()
    full = {name: cls({k: i for i, k in enumerate(keys)}) for name, cls in impls.items()}
    rows = []

    def case(name, make_fn, inner=1):
        fns = {impl: make_fn(full[impl], impls[impl]) for impl in impls}
        res = interleaved_ns(fns, inner=inner, rounds=rounds)
        rows.append({"case": name, "ferrodyn": res["ferrodyn"] / N, "reference": res["reference"] / N,
                     "unit": "ns", "reference_name": "torch.utils.weak"})

    def set_existing(d, cls):
        def f():
            for k in keys:
                d[k] = v
        return f

    def get_hit(d, cls):
        def f():
            for k in keys:
                d[k]
        return f

    def get_method(d, cls):
        def f():
            get = d.get
            for k in keys:
                get(k)
        return f

    def contains_hit(d, cls):
        def f():
            for k in keys:
                k in d  # noqa: B015
        return f

    def contains_miss(d, cls):
        def f():
            for k in misses:
                k in d  # noqa: B015
        return f

    def set_then_delete(d, cls):
        e = cls()

        def f():
            for k in keys:
                e[k] = v
                del e[k]
        return f

    def iterate(d, cls):
        def f():
            for _ in d.items():
                pass
        return f

    case("set (existing key)", set_existing)
    case("get d[k] (hit)", get_hit)

    # torch's hits on tensor keys pay for Tensor._fix_weakref in WeakIdRef.__eq__; plain objects
    # show its cost without that
    class Plain:
        pass

    objs = [Plain() for _ in range(N)]
    full_objs = {name: cls({o: i for i, o in enumerate(objs)}) for name, cls in impls.items()}

    def get_hit_plain(d, cls):
        d = full_objs["ferrodyn" if cls is impls["ferrodyn"] else "reference"]

        def f():
            for o in objs:
                d[o]
        return f

    def set_existing_plain(d, cls):
        d = full_objs["ferrodyn" if cls is impls["ferrodyn"] else "reference"]

        def f():
            for o in objs:
                d[o] = v
        return f

    case("get d[k] (hit, plain-object keys)", get_hit_plain)
    case("set (existing key, plain-object keys)", set_existing_plain)
    case("get d.get(k) (hit)", get_method)
    case("contains (hit)", contains_hit)
    case("contains (miss)", contains_miss)
    case("set new key + delete it", set_then_delete)
    case(f"iterate items() over {N} keys (per key)", iterate)

    def insert_new(cls):
        d = cls()

        def f():
            for k in keys:
                d[k] = v
        return f

    def delete(cls):
        d = cls({k: v for k in keys})

        def f():
            for k in keys:
                del d[k]
        return f

    def keys_dying(cls):
        ks = [torch.randn(1) for _ in range(N)]
        d = cls({k: v for k in ks})
        holder = [ks]
        del ks

        def f():
            holder.clear()  # N keys die, their callbacks empty the dict
            assert len(d) == 0
        return f

    gc.collect()
    for name, setup in [("set (new key, into an empty dict)", insert_new), ("delete", delete),
                        (f"keys dying ({N} tensor keys dropped, until empty)", keys_dying)]:
        res = _interleaved_with_setup({impl: (lambda s=setup, c=cls: s(c)) for impl, cls in impls.items()},
                                      rounds=rounds)
        rows.append({"case": name, "ferrodyn": res["ferrodyn"] / N, "reference": res["reference"] / N,
                     "unit": "ns", "reference_name": "torch.utils.weak"})
    return rows


if __name__ == "__main__":
    for r in run():
        print(f"{r['case']:<50} {r['ferrodyn']:10.1f} {r['reference']:10.1f} "
              f"{r['ferrodyn'] / r['reference']:7.3f}")

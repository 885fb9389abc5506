"""Weak dictionaries: ferrodyn.weak.WeakIdKeyDictionary against torch.utils.weak's, in ns per
operation, on tensor keys (what WeakTensorKeyDictionary holds in make_fx and fake tensors), and
for two cases on plain-object keys too.

Each case runs one operation over N keys per call; the two implementations alternate round by
round (timing.interleaved_ns), and cases that need untimed set-up (deleting, keys dying) use the
same alternation with the set-up outside the timed region. Inserting and dying are also measured
at N_BIG keys (`_big_table_rows`), where a key's death is reported as the dictionary's own share:
the cost of freeing a tensor that no dictionary holds is measured alongside and subtracted. Keys
die in the reverse of their insertion order (the tail of the table goes first) and, in a second
row, in a random order (every structure a death touches is then a cache miss, as when a program's
tensors die in no particular order).

    python benches/run.py --group weakdict
    python benches/bench_weakdict.py --baseline OTHER/_C.cpython-311-x86_64-linux-gnu.so

The second form times insert and death (both orders) of this checkout's build, another build of
`ferrodyn._C` loaded beside it, and torch, interleaved in one process (before/after figures).
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

    def insert_new_plain(cls):
        d = cls()

        def f():
            for o in objs:
                d[o] = v
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

    rows.extend(_big_table_rows(impls, rounds=max(6, rounds // 3)))

    gc.collect()
    for name, setup in [("set (new key, into an empty dict)", insert_new),
                        ("set (new key, plain-object keys, into an empty dict)", insert_new_plain),
                        ("delete", delete),
                        (f"keys dying ({N} tensor keys dropped, until empty)", keys_dying)]:
        res = _interleaved_with_setup({impl: (lambda s=setup, c=cls: s(c)) for impl, cls in impls.items()},
                                      rounds=rounds)
        rows.append({"case": name, "ferrodyn": res["ferrodyn"] / N, "reference": res["reference"] / N,
                     "unit": "ns", "reference_name": "torch.utils.weak"})
    return rows


N_BIG = 10_000  # keys in the dictionary for the insert and death rows measured at scale
CHUNK = 250  # keys freed (or inserted) per timed sample


def _timed_inserts(d, keys, v) -> int:
    t0 = time.perf_counter_ns()
    if d is not None:
        for k in keys:
            d[k] = v
    return time.perf_counter_ns() - t0


def _big_table_rows(impls: dict, rounds: int) -> list[dict]:
    """Insert and death at N_BIG keys. A round builds, for each implementation and for "no
    dictionary" (the baseline), N_BIG fresh tensor keys, then times them CHUNK at a time: the
    inserts into an empty dictionary, then the drop of the last reference to each chunk of keys
    (their entries removed by the weakref callbacks). The order of the three kinds is shuffled
    each round; each figure is the median over every chunk of every round (per key). The death
    rows report the dictionary's own share: the time to free the keys minus the baseline's time
    to free the same number of tensors held by no dictionary. The garbage collector is paused
    while these rows run (timeit's convention): each new weakref (ferrodyn's) or WeakIdRef
    (torch's) is a GC-tracked allocation, and the generation-0 collections they trigger would
    otherwise be timed as part of an insert, alike for both."""
    kinds = {"ferrodyn": impls["ferrodyn"], "reference": impls["reference"], "none": None}
    ins = {k: [] for k in kinds}
    die = {k: [] for k in kinds}
    die_shuffled = {k: [] for k in kinds}
    was_enabled = gc.isenabled()
    gc.disable()  # timeit's convention: collections triggered by allocations are not timed
    try:
        _big_table_rounds(kinds, rounds, ins, die)
        _big_table_rounds(kinds, rounds, {k: [] for k in kinds}, die_shuffled, shuffled=True)
    finally:
        if was_enabled:
            gc.enable()
    med = {k: (statistics.median(ins[k]), statistics.median(die[k])) for k in kinds}
    base = med["none"][1]
    shuf = {k: statistics.median(die_shuffled[k]) for k in kinds}
    return [
        {"case": f"set (new key, {N_BIG} keys into an empty dict)", "ferrodyn": med["ferrodyn"][0],
         "reference": med["reference"][0], "unit": "ns", "reference_name": "torch.utils.weak"},
        {"case": f"keys dying, total ({N_BIG} keys; {base:.0f} ns of it frees the tensor)",
         "ferrodyn": med["ferrodyn"][1], "reference": med["reference"][1], "unit": "ns",
         "reference_name": "torch.utils.weak"},
        {"case": f"keys dying, dictionary's own share ({N_BIG} keys)",
         "ferrodyn": med["ferrodyn"][1] - base, "reference": med["reference"][1] - base,
         "unit": "ns", "reference_name": "torch.utils.weak"},
        {"case": f"keys dying in random order, dictionary's own share ({N_BIG} keys)",
         "ferrodyn": shuf["ferrodyn"] - shuf["none"], "reference": shuf["reference"] - shuf["none"],
         "unit": "ns", "reference_name": "torch.utils.weak"},
    ]


def _big_table_rounds(kinds, rounds, ins, die, shuffled: bool = False) -> None:
    """`shuffled`: the keys die in a random order (the same permutation for every kind in a
    round) instead of the reverse of their insertion."""
    import random

    import torch

    v = object()
    for r in range(rounds):
        gc.collect()
        order = list(kinds)
        random.shuffle(order)
        for kind in order:
            cls = kinds[kind]
            keys = [torch.randn(1) for _ in range(N_BIG)]
            d = cls() if cls is not None else None
            for i in range(0, N_BIG, CHUNK):
                chunk = keys[i:i + CHUNK]
                ins[kind].append(_timed_inserts(d, chunk, v) / CHUNK)
            del chunk
            if shuffled:
                random.Random(r).shuffle(keys)
            chunks = [keys[i:i + CHUNK] for i in range(0, N_BIG, CHUNK)]
            del keys
            while chunks:
                holder = [chunks.pop()]
                t0 = time.perf_counter_ns()
                holder.clear()  # CHUNK keys die
                die[kind].append((time.perf_counter_ns() - t0) / CHUNK)
            if d is not None:
                assert len(d) == 0


def _load_baseline(path: str):
    """Another build of ferrodyn._C (e.g. main's), loaded beside the current one under its own
    module object, so that two builds are timed in one process."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("ferrodyn._C", path)
    spec = importlib.util.spec_from_file_location("ferrodyn._C", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod.WeakIdKeyDictionary


def compare_builds(baseline_so: str, rounds: int) -> dict:
    """Insert and death at N_BIG keys for this build, a baseline build and torch, in one process
    (the kinds shuffled each round, as in `_big_table_rows`). Returns {kind: (insert ns, death's
    own share ns, own share when keys die in random order ns)}."""
    impls = _impls()
    kinds = {"ferrodyn": impls["ferrodyn"], "baseline": _load_baseline(baseline_so),
             "reference": impls["reference"], "none": None}
    ins = {k: [] for k in kinds}
    die = {k: [] for k in kinds}
    die_shuffled = {k: [] for k in kinds}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):  # the two orders alternate, one round each
            _big_table_rounds(kinds, 1, ins, die)
            _big_table_rounds(kinds, 1, {k: [] for k in kinds}, die_shuffled, shuffled=True)
    finally:
        if was_enabled:
            gc.enable()
    base = statistics.median(die["none"])
    base_shuffled = statistics.median(die_shuffled["none"])
    return {k: (statistics.median(ins[k]), statistics.median(die[k]) - base,
                statistics.median(die_shuffled[k]) - base_shuffled) for k in kinds}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", help="path of another build's _C*.so: time insert and death of "
                                       "this build, that build and torch side by side")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if args.baseline:
        res = compare_builds(args.baseline, args.rounds)
        print(f"{'kind':<10} {'insert':>9} {'death':>9} {'random':>9}   (ns per key, {N_BIG} keys; "
              f"deaths: the dictionary's own share, reverse / random order)")
        for k, (i, d, shuf) in res.items():
            print(f"{k:<10} {i:9.1f} {d:9.1f} {shuf:9.1f}")
        ref = res["reference"]
        for k in ("ferrodyn", "baseline"):
            print(f"{k}: {ref[0] / res[k][0]:.2f}x faster than torch on insert, "
                  f"{ref[1] / res[k][1]:.2f}x on death, {ref[2] / res[k][2]:.2f}x on death in random order")
    else:
        for r in run(args.rounds):
            print(f"{r['case']:<50} {r['ferrodyn']:10.1f} {r['reference']:10.1f} "
                  f"{r['ferrodyn'] / r['reference']:7.3f}")

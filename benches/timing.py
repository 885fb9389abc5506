"""Timing helpers shared by the bench modules: medians of per-call times over many rounds."""

from __future__ import annotations

import statistics
import time


def per_call_ns(fn, inner: int, rounds: int) -> float:
    """Median over `rounds` of the mean time of `inner` back-to-back calls of `fn()`, in ns."""
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t0) / inner)
    return statistics.median(samples)


def interleaved_ns(fns: dict, inner: int, rounds: int) -> dict:
    """Like per_call_ns for several functions, alternating them round by round so that machine
    noise hits each alike. Returns {name: median ns per call}."""
    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter_ns()
            for _ in range(inner):
                fn()
            samples[k].append((time.perf_counter_ns() - t0) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}

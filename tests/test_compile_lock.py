"""One compile per code object at a time: threads that miss on a code object another thread is
compiling run their frame eagerly meanwhile (no duplicate entries, no deadlock when the compile
runs user code), and a frame that misses just after another thread's compile finished runs the
new entry instead of compiling it again."""

from __future__ import annotations

import threading
import time

import torch

import ferrodyn
from ferrodyn import _C
from counting_backend import CountingBackend


class SlowBackend(CountingBackend):
    """Counts graphs and sleeps while compiling (the GIL released), so that every thread
    misses while the first compile is still in flight."""

    def __call__(self, gm, example_inputs):
        time.sleep(0.3)
        return super().__call__(gm, example_inputs)


def _run_threads(fn, args, n=4):
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def worker(i):
        try:
            barrier.wait()
            results[i] = fn(*args)
        except Exception as e:  # pragma: no cover - reported by the assertion below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    assert errors == []
    return results


def test_four_threads_one_compile_one_entry(fresh_ferrodyn):
    def f(x, y):
        return torch.sin(x) * y + 1

    backend = SlowBackend()
    cf = ferrodyn.compile(f, backend=backend)
    x, y = torch.randn(5), torch.randn(5)
    results = _run_threads(cf, (x, y))
    expected = f(x, y)
    assert all(torch.allclose(r, expected) for r in results)
    assert backend.count == 1
    assert len(_C.cache_entries(f.__code__)) == 1
    # later calls hit that entry
    hits = _C.cache_entries(f.__code__)[0].hits
    assert torch.allclose(cf(x, y), expected)
    assert _C.cache_entries(f.__code__)[0].hits == hits + 1
    # (torch.compile is not compared: on this torch, four threads compile it four times)


def test_compiles_of_different_code_objects_overlap(fresh_ferrodyn):
    """Two code objects compiled at once in two threads: neither waits for the other (each
    backend call sleeps 0.3 s; both compile, and each thread gets its own graph)."""
    def f(x):
        return x.cos() + 2

    def g(x):
        return x.sin() - 2

    be_f, be_g = SlowBackend(), SlowBackend()
    cf, cg = ferrodyn.compile(f, backend=be_f), ferrodyn.compile(g, backend=be_g)
    x = torch.randn(3)
    barrier = threading.Barrier(2)
    out = {}

    def run(name, fn):
        barrier.wait()
        out[name] = fn(x)

    ts = [threading.Thread(target=run, args=("f", cf)), threading.Thread(target=run, args=("g", cg))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert torch.allclose(out["f"], f(x)) and torch.allclose(out["g"], g(x))
    assert be_f.count == 1 and be_g.count == 1
    assert len(_C.cache_entries(f.__code__)) == 1 and len(_C.cache_entries(g.__code__)) == 1


def test_compile_running_user_code_that_waits_on_another_thread(fresh_ferrodyn):
    """The backend (user code, run during the compile) waits for another thread that calls the
    same compiled function: that thread must not block on the compile in flight."""
    def f(x):
        return x * 3

    done = threading.Event()
    box = {}

    def backend(gm, example_inputs):
        def other():
            box["other"] = cf(torch.ones(2))
            done.set()

        t = threading.Thread(target=other)
        t.start()
        assert done.wait(timeout=30), "the other thread blocked on the compile in flight"
        t.join()
        return gm.forward

    cf = ferrodyn.compile(f, backend=backend)
    assert torch.equal(cf(torch.ones(2)), torch.full((2,), 3.0))
    assert torch.equal(box["other"], torch.full((2,), 3.0))
    assert len(_C.cache_entries(f.__code__)) == 1


def test_returned_existing_entry_is_not_inserted_twice(clean_hook_cache):
    """A callback that returns an entry already in the code's cache runs it; the cache keeps
    one copy."""
    def f(x):
        return x + 1

    def entry_fn(x):
        return x + 100

    tree = _C.GuardBuilder().build()  # no guards: always passes
    entry = _C.CacheEntry(entry_fn, tree)
    _C.insert_entry(f.__code__, entry)
    _C.insert_entry(f.__code__, entry)
    assert len(_C.cache_entries(f.__code__)) == 1
    assert _C.cache_stats()["entries"] == 1

"""Run one function eagerly, through `ferrodyn.compile` and through `torch.compile`, each with
a CountingBackend, and compare: results (and exceptions) must be eager's; graph counts are
returned for the caller to compare."""

from __future__ import annotations

import copy

import torch

import ferrodyn
from counting_backend import CountingBackend


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
            a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return same(vars(a), vars(b))
    return a == b


def _run(fn, args):
    try:
        return fn(*args), None
    except Exception as e:  # eager's exception is part of the behaviour compared
        return None, type(e)


def run_all(fn, *args):
    """(eager result, ferrodyn result, ferrodyn graphs, torch.compile graphs); asserts that the
    results (and any exception type) are eager's."""
    ferrodyn.reset()
    torch._dynamo.reset()
    want, want_exc = _run(fn, copy.deepcopy(args))
    fd, tc = CountingBackend(), CountingBackend()
    got, got_exc = _run(ferrodyn.compile(fn, backend=fd), copy.deepcopy(args))
    _run(torch.compile(fn, backend=tc), copy.deepcopy(args))
    torch._dynamo.reset()
    assert got_exc is want_exc, (got_exc, want_exc)
    assert same(want, got), (want, got)
    return want, got, fd.count, tc.count


def check_one_graph_like_torch(fn, *args):
    """Results equal eager's; ferrodyn captures the frame in one graph with no frame run
    eagerly, and torch.compile makes no more graphs than that (it makes one too, or breaks
    the frame and makes none)."""
    _, _, fd, tc = run_all(fn, *args)
    ferrodyn.reset()
    reasons = ferrodyn.explain(fn)(*copy.deepcopy(args)).break_reasons
    assert reasons == [], reasons
    assert fd == 1 and tc <= fd, f"ferrodyn made {fd} graphs, torch.compile {tc}"
    return fd

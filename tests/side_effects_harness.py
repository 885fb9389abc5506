"""Differential harness of the side-effects tests: run one function eagerly, under
`ferrodyn.compile` and under `torch.compile` (each with its own fresh module globals and
arguments), and compare results *and* every object the calls could mutate after each call,
aliasing included, plus the number of graphs each compiler produced."""

from __future__ import annotations

import textwrap
from typing import Any, Callable

import torch

import ferrodyn
from counting_backend import CountingBackend


def snap(x: Any, memo: dict | None = None) -> Any:
    """A comparable picture of `x`: contents, types, and which parts are the same object."""
    memo = {} if memo is None else memo
    if isinstance(x, (int, float, str, bool, type(None), bytes)):
        return x
    key = id(x)
    if key in memo:
        return ("alias", memo[key])
    memo[key] = len(memo)
    if isinstance(x, torch.Tensor):
        return ("tensor", x.detach().tolist(), x.dtype, tuple(x.shape))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [snap(i, memo) for i in x])
    if isinstance(x, dict):
        return ("dict", [(k, snap(v, memo)) for k, v in x.items()])
    if isinstance(x, (set, frozenset)):
        if all(isinstance(i, (int, float, str, bool, type(None), bytes, tuple, frozenset))
               for i in x):
            return (type(x).__name__, list(x))  # iteration order is part of the state
        # identity-hashed members: their order follows their addresses, which differ per run;
        # snapped in the order of their contents (make the members distinguishable)
        order = sorted(x, key=lambda i: repr(snap(i, dict(memo))))  # memo copy: cycles stop
        return (type(x).__name__, [snap(i, memo) for i in order])
    if isinstance(x, torch.nn.Module):
        return ("module", type(x).__name__, snap({k: v for k, v in vars(x).items()
                                                  if not k.startswith("_")}, memo),
                [snap(t, memo) for t in x.state_dict().values()])
    if type(x).__name__ in ("dict_keys", "dict_values", "dict_items"):
        return (type(x).__name__, [snap(i, memo) for i in x])
    if hasattr(x, "__dict__"):
        return ("obj", type(x).__name__, snap(dict(vars(x)), memo))
    return ("other", repr(x))


def differential(src: str, fname: str, make_args: Callable[[dict], tuple], calls: int = 3,
                 state: Callable[[dict], Any] = lambda g: None, inner: str = "eager",
                 compare_torch_count: bool = True) -> dict:
    """Run `fname` from `src` three ways; assert ferrodyn == eager after every call and
    ferrodyn's graph count after the first call == torch.compile's. Returns the per-mode details."""
    src = textwrap.dedent(src)
    out = {}
    for mode in ("eager", "ferrodyn", "torch"):
        g: dict = {"torch": torch, "__name__": f"sfx_{mode}"}
        exec(compile(src, f"<sfx {fname}>", "exec"), g)
        fn = g[fname]
        cb = CountingBackend(inner)
        if mode == "ferrodyn":
            ferrodyn.reset()
            fn = ferrodyn.compile(fn, backend=cb)
        elif mode == "torch":
            torch._dynamo.reset()
            fn = torch.compile(fn, backend=cb)
        args = make_args(g)
        trace = []
        first_count = None
        for _ in range(calls):
            try:
                r = ("ok", fn(*args))
            except Exception as e:  # eager raising must be reproduced
                r = ("raised", type(e).__name__)
            memo: dict = {}
            trace.append((snap(r, memo), snap(args, memo), snap(state(g), memo)))
            if first_count is None:
                first_count = cb.count
            out[mode] = (trace, first_count, cb.count)
        if mode == "ferrodyn":
            ferrodyn.reset()
    for i, (want, got) in enumerate(zip(out["eager"][0], out["ferrodyn"][0])):
        assert got == want, f"call {i}: ferrodyn {got} != eager {want}"
    if compare_torch_count:
        # graphs after the first call (later calls recompile on changed state; torch then
        # turns changed ints dynamic, which is the dynamic-shapes work, not this comparison)
        assert out["ferrodyn"][1] == out["torch"][1], \
            f"graphs after call 1: ferrodyn {out['ferrodyn'][1]}, torch.compile {out['torch'][1]}"
    return out

"""Whole-model call time on third-party model code (the zoo's transformers and timm cases,
tests/models_zoo/thirdparty.py): a compiled call with backend="eager" against the eager call
(the compiled model must be no slower: issue 7), and against torch.compile(backend="eager"),
all three timed in alternating rounds in this process, inference under no_grad. Medians of
this thread's CPU time per call, one intra-op thread (small models, like the overhead bench)."""

from __future__ import annotations

import pathlib
import statistics
import sys
import time
import warnings

import torch

GROUP = "models"
CASES = ("hf_bert", "hf_gpt2", "hf_llama_padded", "hf_t5", "timm_resnet10t")


def _per_call(fn, inner: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(inner):
        fn()
    return (time.thread_time_ns() - t0) / inner


def _time_case(name: str, rounds: int) -> dict[str, float]:
    import torch._dynamo

    import ferrodyn
    from models_zoo.cases import invoke
    from models_zoo.thirdparty import THIRDPARTY_BY_NAME

    case = THIRDPARTY_BY_NAME[name]
    model = case.build().eval()
    inputs = case.inputs(0, 0)
    ferrodyn.reset()
    torch._dynamo.reset()
    compiled = {"eager": model, "ferrodyn": ferrodyn.compile(model, backend="eager"),
                "torch": torch.compile(model, backend="eager")}
    fns = {k: (lambda m=m: invoke(m, inputs)) for k, m in compiled.items()}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for fn in fns.values():  # capture, then warm the caches
            for _ in range(3):
                fn()
        for _ in range(rounds):
            for k, fn in fns.items():
                samples[k].append(_per_call(fn, 5))
    return {k: statistics.median(v) for k, v in samples.items()}


def run(rounds: int = 30) -> list[dict]:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in CASES:
                t = _time_case(name, rounds)
                rows.append({"case": f"{name}: compiled vs eager", "ferrodyn": t["ferrodyn"] / 1e3,
                             "reference": t["eager"] / 1e3, "unit": "us",
                             "reference_name": "eager / torch.compile"})
                rows.append({"case": f"{name}: vs torch.compile", "ferrodyn": t["ferrodyn"] / 1e3,
                             "reference": t["torch"] / 1e3, "unit": "us"})
    finally:
        torch.set_num_threads(threads)
    return rows

"""The zoo's differential routine: compiled vs eager on the same inputs and RNG seed over a
first call (capture), a second call (cache hit), a call with other shapes (recompile) and, where
the case has one, a state change (a config flag flipped, train/eval switched); outputs, module
state and gradients compared after every call. Also counts graphs: ferrodyn's through a counting
backend and ferrodyn's compile records, torch.compile's through CompileCounter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from counting_backend import CountingBackend  # noqa: F401  (re-exported for the zoo)

import torch
import torch.nn as nn

from models_zoo.cases import Case, invoke





def _flatten(out, path="out") -> list[tuple[str, Any]]:
    """(path, leaf) pairs of an output: tuples, lists, dicts, namedtuples and dataclasses are
    containers; their types are part of the path so that structure differences show."""
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return [(f"{path}:{type(out).__name__}", None)] + [
            p for f in dataclasses.fields(out) for p in _flatten(getattr(out, f.name), f"{path}.{f.name}")]
    if isinstance(out, (tuple, list)):
        return [(f"{path}:{type(out).__name__}[{len(out)}]", None)] + [
            p for i, v in enumerate(out) for p in _flatten(v, f"{path}[{i}]")]
    if isinstance(out, dict):
        return [(f"{path}:{type(out).__name__}{list(out)}", None)] + [
            p for k, v in out.items() for p in _flatten(v, f"{path}[{k!r}]")]
    return [(path, out)]


def _tensors(out) -> list[torch.Tensor]:
    return [t for _, t in _flatten(out) if isinstance(t, torch.Tensor)]


def _loss(out) -> torch.Tensor:
    return sum(t.float().sum() for t in _tensors(out) if t.is_floating_point() and t.requires_grad)


def assert_same(got, want, case: Case, what: str) -> None:
    """Same structure and types, equal values (tensors with the case's tolerance)."""
    g, w = _flatten(got), _flatten(want)
    assert [p for p, _ in g] == [p for p, _ in w], f"{case.name} {what}: structure {g} != {w}"
    for (path, a), (_, b) in zip(g, w):
        assert type(a) is type(b), f"{case.name} {what} {path}: {type(a).__name__} != {type(b).__name__}"
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, atol=case.atol, rtol=case.rtol, equal_nan=True,
                                       msg=lambda m: f"{case.name} {what} {path}: {m}")
        else:
            assert a == b, f"{case.name} {what} {path}: {a!r} != {b!r}"


def _args_of(inputs) -> tuple:
    return (tuple(inputs.args), dict(inputs.kwargs)) if hasattr(inputs, "kwargs") else tuple(inputs)


def _prepare(case: Case):
    eager, other = case.build(), case.build()  # built twice from one seed (a deepcopy would
    if isinstance(eager, nn.Module):          # share hooks' closures between the two)
        eager.train(case.train)
        other.train(case.train)
        for (k, a), (_, b) in zip(eager.state_dict().items(), other.state_dict().items()):
            assert torch.equal(a, b), f"{case.name}: build() is not deterministic ({k})"
    return eager, other


def _state(model) -> dict[str, torch.Tensor]:
    return dict(model.state_dict()) if isinstance(model, nn.Module) else {}


@dataclass
class Report:
    """What one run of a case saw."""

    graphs_first: int = 0        # graphs after the first call
    graphs_hit: int = 0          # after the second call (same shapes)
    graphs_reshaped: int = 0     # after the call with other shapes
    graphs_changed: int = 0      # after the state change (if the case has one)
    hits: int = 0                # cache hits during the second call
    steps: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)   # co_qualname of each captured frame
    eager: list[str] = field(default_factory=list)    # why frames ran eagerly
    codes: list[Any] = field(default_factory=list)    # code object of each captured frame


class _Recorder:
    """Listens to ferrodyn's compile records (the protocol `explain` uses)."""

    def __init__(self, rep: Report):
        self.rep = rep

    def on_graph(self, record) -> None:
        self.rep.frames.append(record.code.co_qualname)
        self.rep.codes.append(record.code)

    def on_eager(self, record) -> None:
        self.rep.eager.append(f"{record.code.co_qualname}: {record.reason}")


def is_top_frame(model, code) -> bool:
    """Whether `code` is the frame that covers all of `model`: its forward (for torch's own
    modules, OptimizedModule's per-module call frame), or the function itself."""
    if isinstance(model, nn.Module):
        fwd = type(model).forward.__code__
        return code is fwd or code.co_name == f"{type(model).__name__}_call"
    return code is model.__code__


def run_case(case: Case, compile_fn: Callable[[Any], Any], count: Callable[[], int], *,
             grad: bool = False, rep: Report | None = None) -> Report:
    """Differential run: eager and compiled copies of the model on the same inputs (and seeds)
    over capture, cache hit, reshape and state change; outputs, module state and (with `grad`)
    parameter gradients must match after every call. Raises AssertionError on a mismatch."""
    from ferrodyn import _C

    eager, other = _prepare(case)
    compiled = compile_fn(other)
    rep = rep if rep is not None else Report()

    def call(step: str, variant: int, seed: int) -> None:
        args, args_c = case.inputs(variant, seed), case.inputs(variant, seed)  # each run its own
        torch.manual_seed(100 + seed)                                        # (inputs may be
        want = invoke(eager, args)                                           # mutated in place)
        torch.manual_seed(100 + seed)
        got = invoke(compiled, args_c)
        assert_same(got, want, case, f"[{step}] output")
        assert_same(_args_of(args_c), _args_of(args), case, f"[{step}] inputs after the call")
        if grad:
            _loss(want).backward()
            _loss(got).backward()
            for (name, pe), (_, pc) in zip(eager.named_parameters(), other.named_parameters()):
                assert (pe.grad is None) == (pc.grad is None), f"{case.name} [{step}] grad of {name}"
                if pe.grad is not None:
                    torch.testing.assert_close(pc.grad, pe.grad, atol=case.atol * 10, rtol=case.rtol * 10,
                                               msg=lambda m: f"{case.name} [{step}] grad of {name}: {m}")
            eager.zero_grad(set_to_none=True)
            other.zero_grad(set_to_none=True)
        se, sc = _state(eager), _state(other)
        assert se.keys() == sc.keys()
        for k in se:
            torch.testing.assert_close(sc[k], se[k], atol=case.atol, rtol=case.rtol,
                                       msg=lambda m: f"{case.name} [{step}] state {k}: {m}")
        rep.steps.append(step)

    call("capture", 0, 0)
    rep.graphs_first = count()
    hits = _C.cache_stats()["hits"]
    call("cache hit", 0, 1)
    rep.hits = _C.cache_stats()["hits"] - hits
    rep.graphs_hit = count()
    call("reshape", 1, 2)
    rep.graphs_reshaped = count()
    if case.change is not None:
        case.change(eager)
        case.change(other)
        call("after change", 0, 3)
        call("after change, again", 0, 4)
    rep.graphs_changed = count()
    return rep


def ferrodyn_run(case: Case, backend: str = "eager", *, grad: bool = False) -> tuple[Report, CountingBackend]:
    import ferrodyn
    from ferrodyn import convert_frame

    ferrodyn.reset()
    counter = CountingBackend(backend)
    rep = Report()
    recorder = _Recorder(rep)
    convert_frame.recorders.append(recorder)
    try:
        run_case(case, lambda m: ferrodyn.compile(m, backend=counter), lambda: counter.count, grad=grad, rep=rep)
    finally:
        convert_frame.recorders.remove(recorder)
        ferrodyn.reset()
    return rep, counter


def torch_graph_count(case: Case) -> int:
    """Graphs torch.compile(backend="eager") captures on the first call."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    cnt = CompileCounter()
    model = case.build()
    if isinstance(model, nn.Module):
        model.train(case.train)
    compiled = torch.compile(model, backend=cnt)
    torch.manual_seed(100)
    invoke(compiled, case.inputs(0, 0))
    torch._dynamo.reset()
    return cnt.frame_count


def eager_reasons(case: Case) -> list[str]:
    """ferrodyn.explain's reasons for frames that ran eagerly on the first call."""
    import ferrodyn

    model = case.build()
    if isinstance(model, nn.Module):
        model.train(case.train)
    torch.manual_seed(100)
    out = invoke(ferrodyn.explain(model), case.inputs(0, 0))
    ferrodyn.reset()
    return list(out.break_reasons)

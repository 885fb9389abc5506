"""Recompilation through the whole frontend pipeline (hook -> callback -> backend -> guards ->
codegen -> cache), counted with a counting backend: a frame is compiled again exactly when a
guard fails (shape, dtype, requires_grad, a global flag, a constant argument, module training
mode) and not otherwise; past cache_size_limit it runs eagerly; recompiles are logged with the
failing guard.

Each test runs with two tracers: `ferrodyn.symbolic.trace_frame` (the real converter, skipped
while it is not built) and `fx_tracer` below, a stand-in that specialises the frame by running
it under make_fx and guards on what it read — so these tests pin the frontend's part alone.
"""

import logging
import types
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ferrodyn
from ferrodyn.symbolic import trace_frame
from counting_backend import CountingBackend
from ferrodyn import _C, config
from ferrodyn.convert_frame import FrameCallback
from ferrodyn.eval_frame import wrap_compiled
from ferrodyn.guard_spec import GuardKind, GuardSpec
from ferrodyn.source import AttrSource, GlobalSource, LocalSource
from ferrodyn.trace_result import OutGraph, OutTuple, TraceResult


def fx_tracer(code, f_globals, f_builtins, args, closure, *, fullgraph=False):
    """Stand-in converter: tensors in the argument slots are graph inputs; everything else is
    specialised (guarded by EQUALS / ID_MATCH); int/bool globals the code names are guarded;
    an nn.Module argument is guarded by identity and training flag. Output: a tensor or a
    tuple of tensors."""
    fn = types.FunctionType(code, f_globals, code.co_name, None, closure)
    names = code.co_varnames[:len(args)]
    tensor_slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    guards = []
    for i, (name, a) in enumerate(zip(names, args)):
        src = LocalSource(i, name)
        if isinstance(a, torch.Tensor):
            guards.append(GuardSpec.make(src, GuardKind.TENSOR_MATCH, a))
        elif isinstance(a, torch.nn.Module):
            guards.append(GuardSpec.make(src, GuardKind.ID_MATCH, a))
            guards.append(GuardSpec.make(AttrSource(src, "training"), GuardKind.EQUALS, a.training))
        elif type(a) in (int, float, bool, str, type(None)):
            guards.append(GuardSpec.make(src, GuardKind.EQUALS, a))
        else:
            guards.append(GuardSpec.make(src, GuardKind.ID_MATCH, a))
    for n in code.co_names:
        v = f_globals.get(n)
        if type(v) in (bool, int):
            guards.append(GuardSpec.make(GlobalSource(n), GuardKind.EQUALS, v))

    def flat(*tensors):
        full = list(args)
        for i, t in zip(tensor_slots, tensors):
            full[i] = t
        out = fn(*full)
        return tuple(out) if isinstance(out, tuple) else (out,)

    example = [args[i] for i in tensor_slots]
    gm = make_fx(flat)(*example)
    probe = fn(*args)
    n_out = len(probe) if isinstance(probe, tuple) else 1
    out = OutTuple(tuple(OutGraph(i) for i in range(n_out))) if isinstance(probe, tuple) else OutGraph(0)
    return TraceResult(gm, [LocalSource(i, names[i]) for i in tensor_slots], example, out, guards)


@pytest.fixture(params=["fx_tracer", "symbolic"])
def tracer(request):
    return fx_tracer if request.param == "fx_tracer" else trace_frame




@pytest.fixture
def compile_counted(tracer):
    ferrodyn.reset()
    backend = CountingBackend()

    def make(fn, **kw):
        return wrap_compiled(fn, FrameCallback(backend, tracer=tracer, **kw))

    make.backend = backend
    yield make
    ferrodyn.reset()


def check(compiled, fn, *args):
    got, want = compiled(*args), fn(*args)
    if isinstance(want, tuple):
        assert all(torch.allclose(a, b) for a, b in zip(got, want))
    else:
        assert torch.allclose(got, want)


# ---- the functions under test (module-level: real user code) ----------------------------------

FLAG = True


def affine(x, y):
    return x * 2 + y


def with_const(x, n):
    return x * n + 1


def with_flag(x):
    if FLAG:
        return x + 1
    return x - 1


def call_module(mod, x):
    return mod(x)


class Drop(torch.nn.Module):
    def forward(self, x):
        return x * 2 if self.training else x / 2


# ---- recompiles exactly when they should ----------------------------------------------------

def test_same_metadata_different_values_hits(compile_counted):
    c = compile_counted(affine)
    for _ in range(3):
        check(c, affine, torch.randn(3, 4), torch.randn(3, 4))
    assert compile_counted.backend.count == 1
    assert len(_C.cache_entries(affine.__code__)) == 1


def test_shape_change_recompiles_and_old_shape_still_hits(compile_counted):
    c = compile_counted(affine)
    check(c, affine, torch.randn(3, 4), torch.randn(3, 4))
    check(c, affine, torch.randn(5, 4), torch.randn(5, 4))
    assert compile_counted.backend.count == 2
    check(c, affine, torch.randn(3, 4), torch.randn(3, 4))
    check(c, affine, torch.randn(5, 4), torch.randn(5, 4))
    assert compile_counted.backend.count == 2


def test_dtype_change_recompiles(compile_counted):
    c = compile_counted(affine)
    check(c, affine, torch.randn(3), torch.randn(3))
    check(c, affine, torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64))
    assert compile_counted.backend.count == 2


def test_requires_grad_change_recompiles(compile_counted):
    c = compile_counted(affine)
    check(c, affine, torch.randn(3), torch.randn(3))
    x = torch.randn(3, requires_grad=True)
    out = c(x, torch.randn(3))
    assert out.requires_grad
    assert compile_counted.backend.count == 2


def test_grad_mode_change_recompiles(compile_counted):
    c = compile_counted(affine)
    x = torch.randn(3, requires_grad=True)
    assert c(x, torch.randn(3)).requires_grad
    with torch.no_grad():
        assert not c(x, torch.randn(3)).requires_grad
    assert compile_counted.backend.count == 2


def test_global_flag_change_recompiles(compile_counted):
    global FLAG
    c = compile_counted(with_flag)
    x = torch.randn(3)
    try:
        check(c, with_flag, x)
        FLAG = False
        check(c, with_flag, x)
        assert compile_counted.backend.count == 2
        FLAG = True
        check(c, with_flag, x)
        assert compile_counted.backend.count == 2
    finally:
        FLAG = True


def test_constant_argument_change_recompiles(compile_counted):
    c = compile_counted(with_const)
    x = torch.randn(3)
    check(c, with_const, x, 2)
    check(c, with_const, x, 2)
    assert compile_counted.backend.count == 1
    check(c, with_const, x, 3)
    assert compile_counted.backend.count == 2


def test_module_training_mode_change_recompiles(compile_counted):
    m = Drop()
    c = compile_counted(call_module)
    x = torch.randn(4)
    check(c, call_module, m, x)
    m.eval()
    check(c, call_module, m, x)
    assert compile_counted.backend.count == 2
    m.train()
    check(c, call_module, m, x)
    assert compile_counted.backend.count == 2


# ---- the cache limit ----------------------------------------------------------------------------

def test_past_the_cache_limit_frames_run_eagerly(compile_counted):
    c = compile_counted(affine, dynamic=False)  # every size a new entry
    with config.patch(cache_size_limit=2), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 6):
            check(c, affine, torch.randn(n), torch.randn(n))
        limit_warnings = [w for w in caught if issubclass(w.category, RuntimeWarning)
                          and "cache size limit" in str(w.message) and "affine" in str(w.message)]
        assert len(limit_warnings) == 1
        assert compile_counted.backend.count == 2
        assert len(_C.cache_entries(affine.__code__)) == 2
        check(c, affine, torch.randn(1), torch.randn(1))  # a cached shape still hits
        assert compile_counted.backend.count == 2


# ---- logging ----------------------------------------------------------------------------------

def test_recompile_is_logged_with_the_failing_guard(compile_counted, caplog):
    c = compile_counted(with_const)
    x = torch.randn(3)
    with caplog.at_level(logging.DEBUG, logger="ferrodyn.recompiles"):
        c(x, 2)
        assert not [r for r in caplog.records if r.name == "ferrodyn.recompiles"]
        c(x, 5)
    msgs = [r.getMessage() for r in caplog.records if r.name == "ferrodyn.recompiles"]
    assert len(msgs) == 1
    assert "with_const" in msgs[0] and "L['n']" in msgs[0] and "5" in msgs[0]


def test_graph_and_guards_are_logged(compile_counted, caplog):
    c = compile_counted(affine)
    with caplog.at_level(logging.DEBUG, logger="ferrodyn"):
        c(torch.randn(2), torch.randn(2))
    by = {r.name: r.getMessage() for r in caplog.records}
    assert "affine" in by["ferrodyn.graph"] and "mul" in by["ferrodyn.graph"]
    assert "L['x']" in by["ferrodyn.guards"]

"""The frontend pipeline end to end with the real Rust hook, cache and guards, and a stand-in
converter (`fx_tracer` from test_recompile, plus variants that fail): callee frames are
intercepted, torch/ferrodyn/stdlib frames are skipped, unsupported frames run eagerly without
being retraced for the same inputs (or raise under fullgraph), backend failures raise
BackendCompilerFailed, `disable` turns capture off, modules keep their hooks, and references
are not leaked on cache hits."""

import logging
import os
import sys

import pytest
import torch
import torch._dynamo.exc
import torch.nn.functional as F

import ferrodyn
from ferrodyn import _C, convert_frame
from ferrodyn.convert_frame import FrameCallback
from ferrodyn.eval_frame import wrap_compiled
from ferrodyn.exc import BreakReason, Unsupported
from counting_backend import CountingBackend
from test_recompile import fx_tracer


TESTS = os.path.dirname(os.path.abspath(__file__))


class Tracer:
    """fx_tracer, counting its calls per function name, raising Unsupported (or another error)
    for the names in `fail`."""

    def __init__(self, fail=(), reason=BreakReason.UNSUPPORTED_CALL, error=None):
        self.calls = {}
        self.fail = set(fail)
        self.reason = reason
        self.error = error

    def __call__(self, code, *args, **kwargs):
        if not (code.co_filename.startswith(TESTS) or code in convert_frame._ALWAYS_TRACE):  # not a library audit hook
            raise Unsupported(f"not test code: {code.co_name}", BreakReason.UNSUPPORTED_CALL)
        self.calls[code.co_name] = self.calls.get(code.co_name, 0) + 1
        if code.co_name in self.fail:
            if self.error is not None:
                raise self.error
            raise Unsupported(f"print() in {code.co_name}", self.reason,
                              filename=code.co_filename, lineno=code.co_firstlineno)
        return fx_tracer(code, *args, **kwargs)


pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def run(fn, tracer, backend=None, **kw):
    return wrap_compiled(fn, FrameCallback(backend or CountingBackend(), tracer=tracer, **kw))


def inner(x):
    return torch.relu(x) * 3


def outer(x):
    y = inner(x)            # a callee frame: intercepted when outer runs eagerly
    return F.gelu(y) + 1    # F.gelu is a builtin; F.* python helpers are torch's: skipped


def uses_torch_python(x):
    return F.hardswish(x) + F.dropout(x, 0.0)


def test_callees_of_an_eager_frame_get_their_own_graph():
    t = Tracer(fail={"outer"})
    backend = CountingBackend()
    c = run(outer, t, backend)
    x = torch.randn(5)
    for _ in range(3):
        assert torch.allclose(c(x), outer(x))
    assert backend.count == 1                       # inner's graph
    assert len(_C.cache_entries(inner.__code__)) == 1
    assert _C.cache_entries(inner.__code__)[0].hits >= 2
    assert t.calls == {"outer": 1, "inner": 1}       # outer not retraced for the same inputs


def test_torch_and_stdlib_frames_are_skipped_not_traced():
    t = Tracer(fail={"uses_torch_python"})
    c = run(uses_torch_python, t)
    x = torch.randn(4)
    assert torch.allclose(c(x), uses_torch_python(x))
    assert _C.code_flags(F.dropout.__code__) == "skip"
    assert set(t.calls) == {"uses_torch_python"}
    assert convert_frame.is_skipped_file(logging.__file__)
    assert convert_frame.is_skipped_file(torch.__file__)
    assert convert_frame.is_skipped_file(convert_frame.__file__)
    assert not convert_frame.is_skipped_file(__file__)


def test_unsupported_with_fullgraph_raises_a_torch_unsupported():
    t = Tracer(fail={"inner"})
    c = run(inner, t, fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"print\(\) in inner") as info:
        c(torch.randn(2))
    assert isinstance(info.value, ferrodyn.Unsupported) and "test_e2e_pipeline.py" in str(info.value)


def test_unsupported_runs_eagerly_and_retraces_only_for_new_inputs():
    t = Tracer(fail={"inner"})
    c = run(inner, t)
    x = torch.randn(3)
    for _ in range(3):
        assert torch.allclose(c(x), inner(x))
    assert t.calls["inner"] == 1
    assert _C.code_flags(inner.__code__) == "default"
    c(torch.randn(3, 3))                               # other inputs: may be traceable
    assert t.calls["inner"] == 2


def test_input_independent_failure_marks_the_code_skip():
    t = Tracer(fail={"inner"}, reason=BreakReason.UNSUPPORTED_OPCODE)
    c = run(inner, t)
    c(torch.randn(3))
    c(torch.randn(4, 4))
    assert t.calls["inner"] == 1 and _C.code_flags(inner.__code__) == "skip"


def test_internal_tracer_errors_fall_back_to_eager_or_raise_under_fullgraph(caplog):
    t = Tracer(fail={"inner"}, error=KeyError("oops"))
    x = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="ferrodyn"):
        assert torch.allclose(run(inner, t)(x), inner(x))
    assert any("internal error" in r.getMessage() and "oops" in r.getMessage() for r in caplog.records)
    ferrodyn.reset()
    with pytest.raises(KeyError, match="oops"):
        run(inner, t, fullgraph=True)(x)


def test_failing_backend_raises_backend_compiler_failed():
    def broken(gm, example_inputs):
        raise ValueError("no kernels today")

    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="no kernels today") as info:
        run(inner, Tracer(), broken)(torch.randn(2))
    assert isinstance(info.value, ferrodyn.BackendCompilerFailed)
    assert isinstance(info.value.inner_exception, ValueError)
    with pytest.raises(ferrodyn.BackendCompilerFailed, match="not a callable"):
        ferrodyn.reset()
        run(inner, Tracer(), lambda gm, ex: 42)(torch.randn(2))
    assert _C.get_eval_frame() is None  # the callback is restored after the error


def helper(x):
    return x - 1


@ferrodyn.disable
def disabled(x):
    return helper(x) * 2


def calls_disabled(x):
    return disabled(x) + 1


def test_disable_decorator_turns_capture_off_for_the_callee_tree():
    t = Tracer(fail={"calls_disabled"})
    c = run(calls_disabled, t)
    x = torch.randn(3)
    assert torch.allclose(c(x), calls_disabled(x))
    assert set(t.calls) == {"calls_disabled"}
    assert _C.cache_entries(helper.__code__) == []


def test_disable_context_and_non_recursive_disable():
    t = Tracer(fail={"outer"})
    c = run(outer, t)
    x = torch.randn(3)
    with ferrodyn.disable():
        assert _C.get_eval_frame() is None
    assert torch.allclose(c(x), outer(x))
    ferrodyn.reset()
    t = Tracer(fail={"outer"})
    assert ferrodyn.disable(outer, recursive=False) is outer
    run(outer, t)(x)
    assert "outer" not in t.calls and t.calls == {"inner": 1}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def test_optimized_module_runs_hooks_and_captures_forward(monkeypatch):
    # the hooks are user frames too: mutating `seen` is a side effect the converter refuses
    t = Tracer(fail={"pre_hook", "post_hook"}, reason=BreakReason.SIDE_EFFECT)
    monkeypatch.setattr(convert_frame, "_default_tracer", lambda: t)
    backend = CountingBackend()
    net = Net()
    seen = []

    def pre_hook(m, a):
        seen.append("pre")

    def post_hook(m, a, out):
        seen.append("post")

    net.register_forward_pre_hook(pre_hook)
    net.register_forward_hook(post_hook)
    om = ferrodyn.compile(net, backend=backend)
    x = torch.randn(2, 4)
    for _ in range(3):
        assert torch.allclose(om(x), net.forward(x))
    assert seen == ["pre", "post"] * 3
    assert backend.count == 1 and t.calls == {"forward": 1, "pre_hook": 1, "post_hook": 1}


def test_torch_module_is_captured_through_the_inline_frame(monkeypatch):
    t = Tracer()
    monkeypatch.setattr(convert_frame, "_default_tracer", lambda: t)
    lin = torch.nn.Linear(4, 2)
    om = ferrodyn.compile(lin, backend="eager")
    x = torch.randn(3, 4)
    assert torch.allclose(om(x), lin(x))
    # nn.Linear.forward lives in torch (never a frame of its own): the inline frame is traced
    assert t.calls == {"Linear_call": 1}


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * 2

    @ferrodyn.compile(backend="eager")
    def decorated(self, x):
        return x + 1


def test_methods_and_bound_methods(monkeypatch):
    t = Tracer()
    monkeypatch.setattr(convert_frame, "_default_tracer", lambda: t)
    s = Scaler(3)
    x = torch.randn(2)
    assert torch.allclose(ferrodyn.compile(s.apply, backend="eager")(x), x * 2)
    assert torch.allclose(s.decorated(x), x + 1)
    assert torch.allclose(Scaler.decorated(s, x), x + 1)
    assert t.calls == {"apply": 1, "decorated": 1}


def test_cache_hits_do_not_leak_references():
    c = run(inner, Tracer())
    x = torch.randn(3)
    c(x)
    before = sys.getrefcount(x)
    for _ in range(50):
        c(x)
    assert sys.getrefcount(x) == before
    assert _C.cache_entries(inner.__code__)[0].hits >= 50


def test_explain_reports_graphs_guards_and_eager_frames(monkeypatch):
    t = Tracer(fail={"outer"})
    monkeypatch.setattr(convert_frame, "_default_tracer", lambda: t)
    out = ferrodyn.explain(outer)(torch.randn(3))
    assert out.graph_count == 1 and out.graph_break_count >= 1
    assert torch.ops.aten.relu.default in out.ops
    assert any("L['x']" in g for g in out.guards)
    assert any("print() in outer" in r for r in out.break_reasons)
    text = str(out)
    assert "Graph count: 1" in text and "inner" in text and "print() in outer" in text


def user_kernel(*args):
    return (torch.relu(args[0]) * 3,)


def test_python_code_inside_a_compiled_graph_is_never_traced():
    t = Tracer()

    def backend(gm, example_inputs):
        return user_kernel  # user code, run by the entry on every hit

    c = run(inner, t, backend)
    x = torch.randn(3)
    for _ in range(3):
        assert torch.allclose(c(x), inner(x))
    assert t.calls == {"inner": 1}
    assert _C.cache_entries(user_kernel.__code__) == []


def test_an_entry_that_cannot_be_generated_runs_eagerly(caplog):
    from ferrodyn.trace_result import Out

    class Strange(Out):
        pass

    def bad_tracer(code, *args, **kwargs):
        result = fx_tracer(code, *args, **kwargs)
        result.output = Strange()
        return result

    x = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="ferrodyn"):
        assert torch.allclose(run(inner, bad_tracer)(x), inner(x))
    assert any("cannot generate the entry" in r.getMessage() for r in caplog.records)
    assert _C.cache_entries(inner.__code__) == []
    ferrodyn.reset()
    with pytest.raises(TypeError, match="unknown output spec"):
        run(inner, bad_tracer, fullgraph=True)(x)


def test_disabled_module_is_not_traced_inside_a_compiled_call():
    t = Tracer(fail={"uses_module"})
    net = ferrodyn.disable(Net())
    assert isinstance(net, ferrodyn.OptimizedModule)

    def uses_module(x):
        return net(x) + 1

    x = torch.randn(2, 4)
    assert torch.allclose(run(uses_module, t)(x), uses_module(x))
    assert t.calls == {"uses_module": 1}  # Net.forward never reached the tracer


def test_unsupported_carrying_its_guards_is_remembered_by_them():
    from ferrodyn.guard_spec import GuardKind, GuardSpec
    from ferrodyn.source import LocalSource

    calls = []

    def tracer(code, f_globals, f_builtins, args, closure, *, fullgraph=False):
        calls.append(args[1])
        err = Unsupported("data-dependent branch", BreakReason.DATA_DEPENDENT)
        err.guards = [GuardSpec.make(LocalSource(1, "k"), GuardKind.EQUALS, args[1])]
        raise err

    def scaled(x, k):
        return x * k

    c = run(scaled, tracer)
    for shape in (2, 3, 4):
        c(torch.randn(shape), 2)      # the failure depended on k only: no retrace for new shapes
    c(torch.randn(2), 5)
    assert calls == [2, 5]

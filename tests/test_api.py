"""The public API without capture: argument checking, decorator forms, OptimizedModule's
forwarding to the original module, config, logging switches, reset and the explain report."""

import logging
import operator

import pytest
import torch

import ferrodyn
from ferrodyn import _C, config, logs
from ferrodyn.api import ExplainOutput
from ferrodyn.optimized_module import OptimizedModule


def f(x):
    return x.sin()


# ---- compile: arguments ---------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, err, msg", [
    (dict(backend=3), TypeError, "backend must be a str or a callable, got int"),
    (dict(fullgraph="yes"), TypeError, "fullgraph must be a bool, got str"),
    (dict(dynamic=1), TypeError, "dynamic must be None or a bool, got int"),
    (dict(options=["x"]), TypeError, "options must be a dict, got list"),
    (dict(mode="fastest"), RuntimeError, "Unrecognized mode='fastest'"),
    (dict(backend="nonexistent"), torch._dynamo.exc.InvalidBackend, "Invalid backend: 'nonexistent'"),
])
def test_bad_arguments_name_the_problem(kwargs, err, msg):
    with pytest.raises(err, match=msg.replace("(", r"\(").replace(")", r"\)")):
        ferrodyn.compile(f, **kwargs)


def test_bad_arguments_fail_in_the_decorator_form_too():
    with pytest.raises(TypeError, match="fullgraph must be a bool"):
        ferrodyn.compile(fullgraph=None)


def test_non_callable_is_rejected():
    with pytest.raises(TypeError, match="expects a callable or an nn.Module, got int"):
        ferrodyn.compile(5)


def test_decorator_forms_return_wrappers_of_the_function():
    a = ferrodyn.compile(f, backend="eager")

    @ferrodyn.compile
    def b(x):
        return x

    @ferrodyn.compile(backend="eager", fullgraph=True)
    def c(x):
        return x

    for w, name in ((a, "f"), (b, "b"), (c, "c")):
        assert callable(w) and w.__name__ == name and w._ferrodyn_compiled
    assert a.__wrapped__ is f
    assert c._ferrodyn_callback.fullgraph is True


def test_disable_flag_returns_the_function_unchanged():
    assert ferrodyn.compile(f, disable=True) is f


def test_dynamic_true_compiles_without_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ferrodyn.compile(f, backend="eager", dynamic=True)


# ---- OptimizedModule -------------------------------------------------------------------------

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.register_buffer("running", torch.zeros(2))
        self.scale = 2.0

    def forward(self, x):
        return self.fc(x) * self.scale


def test_optimized_module_forwards_attributes_and_state():
    net = Net()
    om = ferrodyn.compile(net, backend="eager")
    assert isinstance(om, OptimizedModule) and isinstance(om, torch.nn.Module)
    assert om._orig_mod is net
    assert om.fc is net.fc and om.scale == 2.0
    om.scale = 3.0
    assert net.scale == 3.0
    om.extra = "x"
    assert net.extra == "x" and "extra" not in om.__dict__
    del om.extra
    assert not hasattr(net, "extra")
    assert list(om.state_dict()) == list(net.state_dict()) == ["running", "fc.weight", "fc.bias"]
    assert [id(p) for p in om.parameters()] == [id(p) for p in net.parameters()]
    assert [n for n, _ in om.named_modules()] == [n for n, _ in net.named_modules()]
    assert [n for n, _ in om.named_buffers()] == ["running"]
    sd = {k: torch.ones_like(v) for k, v in net.state_dict().items()}
    om.load_state_dict(sd)
    assert torch.equal(net.fc.weight, torch.ones(2, 3))


def test_optimized_module_train_eval_follow_the_original():
    net = Net()
    om = ferrodyn.compile(net, backend="eager")
    assert om.training and net.training
    assert om.eval() is om
    assert not net.training and not net.fc.training and not om.training
    om.train()
    assert net.training and net.fc.training
    net.eval()
    assert not om.training
    om.training = True
    assert net.training


def test_optimized_module_dir_and_len():
    seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    om = ferrodyn.compile(seq, backend="eager")
    assert len(om) == 2
    assert "fc" in dir(ferrodyn.compile(Net(), backend="eager"))


def test_torch_module_gets_a_traceable_inline_frame():
    from ferrodyn import convert_frame

    om = ferrodyn.compile(torch.nn.Linear(2, 2), backend="eager")
    target = om.forward._ferrodyn_orig
    assert target.__code__ in convert_frame._ALWAYS_TRACE
    om2 = ferrodyn.compile(Net(), backend="eager")
    assert om2.forward._ferrodyn_orig == om2._orig_mod.__call__


# ---- config ----------------------------------------------------------------------------------

def test_config_validates_and_pushes_cache_size_limit():
    old = config.cache_size_limit
    try:
        config.cache_size_limit = 3
        if hasattr(_C, "get_cache_size_limit"):
            assert _C.get_cache_size_limit() == 3
        with pytest.raises(TypeError, match="cache_size_limit must be a non-negative int"):
            config.cache_size_limit = "8"
        with pytest.raises(AttributeError, match="no setting 'cache_limit'"):
            config.cache_limit = 3
    finally:
        config.cache_size_limit = old


def test_config_patch_restores():
    old = config.cache_size_limit
    with config.patch(cache_size_limit=old + 1, verbose=True):
        assert config.cache_size_limit == old + 1 and config.verbose
    assert config.cache_size_limit == old and not config.verbose

    @config.patch(suppress_errors=False)
    def g():
        return config.suppress_errors
    assert g() is False and config.suppress_errors is True
    assert config.settings()["cache_size_limit"] == old


# ---- logs ------------------------------------------------------------------------------------

def test_log_spec_parsing():
    assert logs.parse("graph, recompiles") == ["graph", "recompiles"]
    assert logs.parse("all") == list(logs.CHANNELS)
    with pytest.raises(ValueError, match="unknown ferrodyn log channel"):
        logs.parse("graphs")


def test_env_switch_enables_exactly_those_channels():
    try:
        assert logs.configure_from_env({"FERRODYN_LOGS": "guards,recompiles"}) == ["guards", "recompiles"]
        assert logs.guards_log.isEnabledFor(logging.DEBUG)
        assert logs.recompiles_log.isEnabledFor(logging.DEBUG)
        assert not logs.graph_log.isEnabledFor(logging.DEBUG)
        assert logs.configure_from_env({}) == []
    finally:
        logs.set_logs("")
    assert not logs.guards_log.isEnabledFor(logging.DEBUG)


# ---- reset and explain -----------------------------------------------------------------------

def test_reset_clears_python_state():
    from ferrodyn import convert_frame

    convert_frame._frame_ids[1] = 5
    ferrodyn.reset()
    assert convert_frame._frame_ids == {} and convert_frame._eager_trees == {}


def test_explain_output_reads_well():
    out = ExplainOutput()
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)

    class Rec:
        code = f.__code__
        graph = gm
        guards = ["L['x'] is a Tensor(float32, [2])"]
        recompile_reasons = []
        reason = "call of a function the converter cannot trace: print"

    out.on_graph(Rec)
    out.on_eager(Rec)
    assert out.graph_count == 1 and out.graph_break_count == 1
    assert out.ops == [torch.relu, operator.add]
    text = str(out)
    assert "Graph count: 1" in text and "print" in text and "L['x']" in text and "relu" in text


def test_explain_rejects_non_callables():
    with pytest.raises(TypeError, match="explain expects a callable"):
        ferrodyn.explain(3)


# ---- compile: one cache, entries per backend ---------------------------------------------------

def _counting_backend(name, counts):
    """A backend recording its compiles and the calls of the graphs it compiled."""
    def backend(gm, example_inputs):
        counts[name]["compiles"] += 1

        def run(*args):
            counts[name]["runs"] += 1
            return gm.forward(*args)
        return run
    return backend


def test_same_function_two_backends_each_runs_its_own_graph():
    ferrodyn.reset()

    def g(x):
        return x.sin() * 2 + 1

    counts = {n: {"compiles": 0, "runs": 0} for n in ("a", "b")}
    ga = ferrodyn.compile(g, backend=_counting_backend("a", counts))
    gb = ferrodyn.compile(g, backend=_counting_backend("b", counts))
    x = torch.randn(4)
    assert torch.equal(ga(x), g(x))
    assert torch.equal(gb(x), g(x))  # b's wrapper does not run a's entry: it compiles its own
    assert counts == {"a": {"compiles": 1, "runs": 1}, "b": {"compiles": 1, "runs": 1}}
    for i in range(3):
        y = torch.randn(4)
        assert torch.equal(ga(y), g(y))
        assert torch.equal(gb(y), g(y))
        assert torch.equal(gb(y), g(y))
    assert counts == {"a": {"compiles": 1, "runs": 4}, "b": {"compiles": 1, "runs": 7}}
    entries = _C.cache_entries(g.__code__)
    ids = sorted(e.backend_id for e in entries)
    assert len(ids) == 2 and 0 not in ids and ids[0] != ids[1]
    assert sorted(e.hits for e in entries) == [3, 6]

    # Run-only mode (as torch's) runs whichever backend's entry passes first (the front one:
    # b's, hit last) and never compiles.
    prior = _C.set_eval_frame(False)
    try:
        assert torch.equal(g(x), x.sin() * 2 + 1)
    finally:
        _C.set_eval_frame(prior)
    assert counts == {"a": {"compiles": 1, "runs": 4}, "b": {"compiles": 1, "runs": 8}}
    ferrodyn.reset()


def test_two_backends_share_the_per_code_limit():
    ferrodyn.reset()

    def g(x):
        return x + 1

    counts = {n: {"compiles": 0, "runs": 0} for n in ("a", "b")}
    with config.patch(cache_size_limit=1):
        ga = ferrodyn.compile(g, backend=_counting_backend("a", counts))
        gb = ferrodyn.compile(g, backend=_counting_backend("b", counts))
        x = torch.randn(3)
        assert torch.equal(ga(x), g(x))
        with pytest.warns(RuntimeWarning, match=r"ferrodyn.config.cache_size_limit") as rec:
            assert torch.equal(gb(x), g(x))  # the limit is reached: b runs eagerly
        msg = str(rec[0].message)
        assert "'test_two_backends_share_the_per_code_limit.<locals>.g'" in msg and "(1 entries)" in msg
        assert f"{__file__}:{g.__code__.co_firstlineno}" in msg
        assert torch.equal(ga(x), g(x))
    assert counts == {"a": {"compiles": 1, "runs": 2}, "b": {"compiles": 0, "runs": 0}}
    ferrodyn.reset()


def test_reset_clears_skip_flags_and_cache_entries():
    def g(x):
        return x

    _C.skip_code(g.__code__)
    assert _C.code_flags(g.__code__) == "skip"
    ferrodyn.reset()
    assert _C.code_flags(g.__code__) == "default"
    assert _C.cache_stats()["entries"] == 0


def test_ferrodyn_logs_environment_variable_in_a_fresh_interpreter(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "prog.py"
    script.write_text(
        "import torch, ferrodyn\n"
        "def f(x):\n"
        "    return torch.relu(x) * 2\n"
        "c = ferrodyn.compile(f, backend='eager')\n"
        "c(torch.randn(2)); c(torch.randn(3))\n"
    )
    env = {**os.environ, "FERRODYN_LOGS": "graph,guards,recompiles",
           "PYTHONPATH": os.path.dirname(os.path.dirname(ferrodyn.__file__))}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "[ferrodyn.graph] graph [0/0] of f" in err and "relu" in err
    assert "[ferrodyn.guards] guards [0/0] of f" in err and "L['x']" in err
    assert "[ferrodyn.recompiles] recompiling f" in err and "L['x'].size()[0] == 2" in err

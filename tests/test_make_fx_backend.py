"""The aten_eager backend: registered with torch under its name, lowers captured graphs to aten
and runs them; torch.compile / ferrodyn.compile results equal eager."""

import importlib

import pytest
import torch

import ferrodyn.proxy_dispatch.backend as backend_mod
from ferrodyn.proxy_dispatch.backend import aten_eager


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))


def test_registered_with_torch_idempotently():
    from torch._dynamo.backends import registry

    assert registry.lookup_backend("aten_eager") is aten_eager
    importlib.reload(backend_mod)  # registering again is a no-op, not a duplicate error
    backend_mod._register()
    assert "aten_eager" in torch._dynamo.list_backends(exclude_tags=())


def test_lowers_a_graph_module_to_aten():
    gm = torch.fx.symbolic_trace(_model())
    x = torch.randn(4, 6)
    compiled = aten_eager(gm, [x])
    targets = [n.target for n in compiled.graph.nodes if n.op == "call_function"]
    assert targets and all(isinstance(t, torch._ops.OpOverload) for t in targets)
    torch.testing.assert_close(compiled(x), gm(x))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_with_aten_eager(dynamic):
    torch._dynamo.reset()
    model = _model()
    graphs = []

    def spy(gm, example_inputs):
        out = aten_eager(gm, example_inputs)
        graphs.append(out)
        return out

    compiled = torch.compile(model, backend=spy, dynamic=dynamic)
    for n in (4, 7, 9):
        x = torch.randn(n, 6)
        torch.testing.assert_close(compiled(x), model(x))
    assert graphs
    ops = {n.target for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.addmm.default in ops and torch.ops.aten.gelu.default in ops
    by_name = torch.compile(model, backend="aten_eager", dynamic=dynamic)
    x = torch.randn(5, 6)
    torch.testing.assert_close(by_name(x), model(x))
    # gradients still flow through the aten ops at run time
    by_name(x).sum().backward()
    assert model[0].weight.grad is not None
    torch._dynamo.reset()


def test_ferrodyn_compile_with_aten_eager():
    try:
        import ferrodyn.api  # noqa: F401
    except ImportError:
        pytest.skip("ferrodyn.compile is not on this branch")
    import ferrodyn

    model = _model()
    compiled = ferrodyn.compile(model, backend=aten_eager)
    x = torch.randn(4, 6)
    torch.testing.assert_close(compiled(x), model(x))

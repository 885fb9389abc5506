"""ferrodyn.compile end to end with the real converter (ferrodyn.symbolic.trace_frame): compiled
results equal eager ones, graphs are counted with a counting backend, unsupported code raises
under fullgraph and runs eagerly otherwise, modules keep their hooks and recompile on a mode
change, and the built-in backends run captured graphs (including backward through aot_eager)."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from ferrodyn import _C





pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def helper(x, k=2):
    return torch.cos(x) * k


def toy(x, y):
    z = torch.sin(x) + helper(y, k=3)
    return z.relu(), z.sum()


def with_print(x):
    print("side effect")
    return x + 1


def test_function_is_one_graph_with_callees_inlined_and_hits_afterwards():
    backend = CountingBackend()
    c = ferrodyn.compile(toy, backend=backend)
    x, y = torch.randn(4), torch.randn(4)
    for _ in range(3):
        got, want = c(x, y), toy(x, y)
        assert all(torch.allclose(a, b) for a, b in zip(got, want))
    assert len(backend.graphs) == 1
    assert _C.cache_entries(toy.__code__)[0].hits == 2
    assert _C.cache_entries(helper.__code__) == []  # inlined, not a frame of its own


def test_fullgraph_unsupported_names_the_construct_and_line(capsys):
    c = ferrodyn.compile(with_print, backend="eager", fullgraph=True)
    with pytest.raises(ferrodyn.Unsupported, match="print") as info:
        c(torch.randn(2))
    assert "test_e2e_compile.py" in str(info.value)
    assert isinstance(info.value, torch._dynamo.exc.Unsupported)


def test_unsupported_without_fullgraph_gives_the_eager_result(capsys):
    backend, torch_backend = CountingBackend(), CountingBackend()
    c = ferrodyn.compile(with_print, backend=backend)
    x = torch.randn(2)
    assert torch.equal(c(x), x + 1) and torch.equal(c(x), x + 1)
    assert capsys.readouterr().out.count("side effect") == 2
    torch.compile(with_print, backend=torch_backend)(x)
    # the print breaks the graph; `x + 1` after it is captured, as torch.compile does
    assert len(backend.graphs) == len(torch_backend.graphs) == 1


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.training:
            h = h * 0.5
        return self.fc2(h)


def test_module_compiles_recompiles_on_eval_and_keeps_hooks():
    backend = CountingBackend()
    net = Block()
    calls = []
    net.register_forward_hook(lambda m, a, out: calls.append(out.shape))
    om = ferrodyn.compile(net, backend=backend)
    x = torch.randn(5, 6)
    assert torch.allclose(om(x), net.forward(x))
    assert torch.allclose(om(x), net.forward(x))
    assert len(backend.graphs) == 1
    om.eval()
    assert torch.allclose(om(x), net.forward(x))
    assert len(backend.graphs) == 2
    assert len(calls) == 3


def test_torch_layer_is_captured_through_the_inline_frame():
    backend = CountingBackend()
    lin = torch.nn.Linear(4, 2)
    om = ferrodyn.compile(lin, backend=backend)
    x = torch.randn(3, 4)
    assert torch.allclose(om(x), lin(x)) and torch.allclose(om(x), lin(x))
    assert len(backend.graphs) == 1


def test_aot_eager_backward_matches_eager():
    net = Block().eval()
    om = ferrodyn.compile(net, backend="aot_eager")
    x = torch.randn(4, 6)
    om(x).sum().backward()
    got = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net(x).sum().backward()
    assert all(torch.allclose(a, p.grad) for a, p in zip(got, net.parameters()))


def test_inductor_backend_runs_the_graph():
    c = ferrodyn.compile(toy)  # default backend: inductor
    x, y = torch.randn(8), torch.randn(8)
    got, want = c(x, y), toy(x, y)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))


def test_explain_lists_graph_ops_and_guards():
    out = ferrodyn.explain(toy)(torch.randn(3), torch.randn(3))
    assert out.graph_count == 1 and out.graph_break_count == 0
    assert torch.sin in out.ops and torch.cos in out.ops
    assert any("L['x']" in g for g in out.guards) and any("L['y']" in g for g in out.guards)
    bad = ferrodyn.explain(with_print)(torch.randn(2))
    assert bad.graph_count == 1 and bad.graph_break_count == 1 and "print" in bad.break_reasons[0]

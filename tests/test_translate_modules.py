"""nn.Module forwards traced like user code: submodules, containers, parameters and buffers
lifted as graph inputs (reached through `__dict__`), the standard layers in eval and train."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ferrodyn.guard_spec import GuardKind
from translate_harness import check, guard_kinds, run_traced, trace


def call(m, x):
    return m(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4, bias=False)
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(16, 2), "b": nn.Linear(16, 3)})
        self.seq = nn.Sequential(nn.ReLU(), nn.Linear(16, 16), nn.Tanh())
        self.register_buffer("scale", torch.tensor(2.0))
        self.alpha = nn.Parameter(torch.ones(16))
        self.use_extra = True

    def forward(self, x):
        h = F.relu(self.fc1(x)) * self.alpha
        for i, layer in enumerate(self.layers):
            h = h + layer(h) if i % 2 == 0 else layer(h)
        h = self.layers[-1](h) + self.layers[0](h)
        h = self.seq(h)
        if self.training:
            h = h * 0.5
        if self.use_extra:
            h = h * self.scale
        outs = {k: head(h) for k, head in self.heads.items()}
        return self.fc2(h), outs, self.heads["a"](h).shape


@pytest.mark.parametrize("train", [True, False])
def test_net(train):
    m = Net().train(train)
    r = check(call, m, torch.randn(5, 8))
    names = [s.name() for s in r.graph_inputs]
    assert "L['m'].__dict__['_modules']['fc1'].__dict__['_parameters']['weight']" in names
    assert "L['m'].__dict__['_buffers']['scale']" in names
    # parameters are lifted inputs, not graph constants
    assert not any(n.op == "get_attr" for n in r.graph.graph.nodes)
    assert GuardKind.EQUALS in guard_kinds(r, "L['m'].__dict__['training']")
    assert GuardKind.TYPE_MATCH in guard_kinds(r, "L['m']")


def test_parameters_loaded_per_call():
    m = Net().eval()
    x = torch.randn(2, 8)
    r = trace(call, m, x)
    with torch.no_grad():
        m.fc1.weight.mul_(2)
    torch.testing.assert_close(run_traced(r, call, m, x)[0], m(x)[0])


LAYERS = [
    lambda: nn.Linear(6, 5),
    lambda: nn.Conv1d(6, 4, 3, padding=1),
    lambda: nn.Conv2d(6, 4, 3, stride=2),
    lambda: nn.BatchNorm1d(6),
    lambda: nn.BatchNorm2d(6),
    lambda: nn.LayerNorm(6),
    lambda: nn.Dropout(0.3),
    lambda: nn.GELU(),
    lambda: nn.Softmax(dim=-1),
    lambda: nn.MaxPool2d(2),
    lambda: nn.AdaptiveAvgPool2d(1),
    lambda: nn.Flatten(),
    lambda: nn.Identity(),
    lambda: nn.GroupNorm(2, 6),
]
SHAPES = {nn.Conv1d: (2, 6, 7), nn.Conv2d: (2, 6, 8, 8), nn.BatchNorm1d: (4, 6),
          nn.BatchNorm2d: (2, 6, 4, 4), nn.MaxPool2d: (2, 6, 4, 4),
          nn.AdaptiveAvgPool2d: (2, 6, 4, 4), nn.GroupNorm: (2, 6, 3)}


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("make", LAYERS)
def test_standard_layers(make, train):
    torch.manual_seed(0)
    m = make().train(train)
    x = torch.randn(*SHAPES.get(type(m), (3, 6)))
    check(call, m, x)


def test_batchnorm_train_updates_running_stats_once():
    m = nn.BatchNorm1d(3).train()
    x = torch.randn(8, 3)
    r = trace(call, m, x)
    m2 = nn.BatchNorm1d(3).train()
    m2.load_state_dict(m.state_dict())
    run_traced(r, call, m, x)
    m2(x)
    torch.testing.assert_close(m.running_mean, m2.running_mean)
    assert int(m.num_batches_tracked) == 1 == int(m2.num_batches_tracked)


def test_embedding():
    m = nn.Embedding(10, 4)
    check(call, m, torch.tensor([[1, 2, 3], [4, 5, 9]]))


@pytest.mark.parametrize("train", [False, True])
def test_multihead_attention(train):
    m = nn.MultiheadAttention(8, 2, batch_first=True).train(train)

    def f(m, q, k):
        out, w = m(q, k, k)
        return out, w
    check(f, m, torch.randn(2, 5, 8), torch.randn(2, 6, 8))


@pytest.mark.parametrize("train", [False, True])
def test_transformer_encoder_layer(train):
    m = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True).train(train)
    check(call, m, torch.randn(2, 5, 8))


def test_transformer_encoder_layer_no_grad_eval():
    m = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True).eval()

    def f(m, x):
        with torch.no_grad():
            return m(x)
    check(f, m, torch.randn(2, 5, 8))


def test_module_with_backward_hook_is_refused():
    """Forward hooks are traced (tests/test_module_hooks.py); backward hooks are refused."""
    from ferrodyn.exc import Unsupported
    m = nn.Linear(2, 2)
    m.register_full_backward_hook(lambda *a: None)
    with pytest.raises(Unsupported):
        trace(call, m, torch.randn(1, 2))


def test_hooks_guarded_empty():
    m = nn.Linear(2, 2)
    r = trace(call, m, torch.randn(1, 2))
    # the module's empty hook dicts are one DICTS_EMPTY leaf on its __dict__
    (g,) = [g for g in r.guards if g.kind is GuardKind.DICTS_EMPTY and g.source is not None
            and g.source.name() == "L['m'].__dict__"]
    assert {"_forward_hooks", "_forward_pre_hooks"} <= set(g.payload)


class Optional_(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        if hasattr(self, "extra"):
            x = x + self.extra
        return self.lin(getattr(self, "maybe", x))


def test_absent_attribute_is_guarded():
    m = Optional_()
    r = check(call, m, torch.randn(1, 2))
    assert GuardKind.DICT_KEYS in guard_kinds(r, "L['m'].__dict__")

"""ferrodyn.make_fx names the root attributes of closed-over tensors as torch's make_fx does
(`_param_constantN` for parameters, `_tensor_constantN` for other tensors, each numbered in
first-use order per prefix, each object stored once) also when there are many of them and the
two prefixes interleave; the attribute search starts at the next free number per prefix
(tracker.py `_attr_node`). Compared node by node with torch's graph, and re-run."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx as torch_make_fx

from ferrodyn.proxy_dispatch import make_fx
from test_make_fx import assert_same

torch.manual_seed(99)
_layers = torch.nn.ModuleList([torch.nn.Linear(6, 6) for _ in range(7)])
_shifts = [torch.randn(6) for _ in range(7)]


def many_constants(x):
    # parameters and plain tensors interleaved; layer 0 is used again at the end (same names)
    for lin, shift in zip(_layers, _shifts):
        x = torch.relu(lin(x)) + shift
    return _layers[0](x) * _shifts[0]


def _attrs(gm):
    return [(n.name, n.target) for n in gm.graph.nodes if n.op == "get_attr"]


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_attribute_names_match_torch(mode):
    x = torch.randn(4, 6)
    ours = make_fx(many_constants, tracing_mode=mode)(x)
    ref = torch_make_fx(many_constants, tracing_mode=mode, _allow_non_fake_inputs=True)(x)
    assert _attrs(ours) == _attrs(ref)
    targets = {target for _, target in _attrs(ours)}
    # one attribute per object; layer 0's parameters and _shifts[0] are read twice
    assert len(targets) == 2 * len(_layers) + len(_shifts)
    assert len(_attrs(ours)) == len(targets) + 3
    assert [n.name for n in ours.graph.nodes] == [n.name for n in ref.graph.nodes]
    for target in targets:
        assert getattr(ours, target) is getattr(ref, target)
    y = torch.randn(4, 6)
    assert_same(ours(y), many_constants(y))

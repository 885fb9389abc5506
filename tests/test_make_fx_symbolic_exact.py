"""ferrodyn.make_fx(tracing_mode="symbolic") produces torch's graph exactly on the programs of
the make_fx bench and on view-, alias- and size-arithmetic-heavy functions: the same generated
code (node names, order, targets, arguments), every node's meta (`val`: shape, stride, dtype,
device, storage offset, requires_grad; `tensor_meta`), and the same ShapeEnv (guards in order,
replacements, and the symbols with their ranges). The graph then runs on inputs of other
sizes and equals eager.

This is the guard rail of the symbolic-tracing speed work (benches/bench_make_fx.py): any
shortcut taken in dispatch, value tracking or tensor_meta that changed what ends up in the
graph or in the ShapeEnv fails here.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from test_make_fx_cache import assert_same_as_torch

torch.manual_seed(4321)
_mlp = torch.nn.Sequential(
    torch.nn.Linear(12, 24), torch.nn.ReLU(), torch.nn.Linear(24, 24), torch.nn.ReLU(),
    torch.nn.Linear(24, 5),
)
_conv = torch.nn.Sequential(
    torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
    torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 6),
).eval()
_encoder = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=24).eval()
_deep = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(8, 8), torch.nn.ReLU())])


def mlp(x):
    return _mlp(x)


def conv(x):
    return _conv(x)


def encoder(x):
    return _encoder(x)


def deep(x):
    # the same layer shape again and again: fake-cache hits on the trace's own ShapeEnv
    return _deep(x)


def attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v, F.scaled_dot_product_attention(q, k, v)


def pointwise(x):
    for _ in range(4):
        x = torch.relu(x * 1.5 + 0.1)
    return x


def views_and_aliases(x):
    # views of views, an in-place op through a view, aliases returned next to their base
    a = x.t()
    b = a.unsqueeze(0).expand(3, -1, -1)
    c = x[1:, ::2]
    d = x.view(-1)[: x.shape[0]]
    e = x.clone()
    e.narrow(0, 0, 2).mul_(2)
    f = e.transpose(0, 1).reshape(-1)
    return a, b.sum(0), c * 2, d + 1, e, f, x.detach().diagonal()


def dynamic_reshape(x, y):
    n, m = x.shape
    z = x.reshape(n * m).view(m, n)
    w = y.view(y.shape[0], -1, 2).permute(2, 0, 1).flatten(1)
    return z + 1, w.new_zeros(w.shape[1] // 2, n - 1), w.sum(-1), torch.cat([x, x], 1).shape[1] * x


def shape_state(gm):
    env = gm.shape_env
    return ([str(g.expr) for g in env.guards],
            sorted((str(k), str(v)) for k, v in env.replacements.items()),
            sorted((str(k), str(v)) for k, v in env.var_to_range.items()))


def torch_shape_state(fn, args):
    from torch.fx.experimental.proxy_tensor import make_fx as torch_make_fx

    torch.manual_seed(0)
    ref = torch_make_fx(fn, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*args)
    env = next(n.meta["val"] for n in ref.graph.nodes if n.op == "placeholder").fake_mode.shape_env
    return ([str(g.expr) for g in env.guards],
            sorted((str(k), str(v)) for k, v in env.replacements.items()),
            sorted((str(k), str(v)) for k, v in env.var_to_range.items()))


PROGRAMS = {
    # name: (fn, trace args, other-size args)
    "mlp": (mlp, lambda: (torch.randn(6, 12),), lambda: (torch.randn(11, 12),)),
    "conv": (conv, lambda: (torch.randn(2, 3, 8, 8),), lambda: (torch.randn(5, 3, 8, 8),)),
    "encoder": (encoder, lambda: (torch.randn(5, 3, 16),), lambda: (torch.randn(7, 2, 16),)),
    "deep": (deep, lambda: (torch.randn(6, 8),), lambda: (torch.randn(9, 8),)),
    "attention": (attention, lambda: tuple(torch.randn(2, 3, 6, 4) for _ in range(3)),
                  lambda: tuple(torch.randn(3, 2, 9, 4) for _ in range(3))),
    "pointwise": (pointwise, lambda: (torch.randn(6, 7),), lambda: (torch.randn(10, 3),)),
    "views_and_aliases": (views_and_aliases, lambda: (torch.randn(5, 4),),
                          lambda: (torch.randn(7, 6),)),
    "dynamic_reshape": (dynamic_reshape, lambda: (torch.randn(4, 3), torch.randn(5, 6)),
                        lambda: (torch.randn(6, 5), torch.randn(3, 10))),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_symbolic_graph_and_shape_env_match_torch(name):
    fn, make_args, other_args = PROGRAMS[name]
    args = make_args()
    gm = assert_same_as_torch(fn, args, "symbolic")  # code, node meta, guards, replacements
    assert shape_state(gm) == torch_shape_state(fn, args)  # and the symbols' ranges
    # the graph is symbolic: it runs on other sizes and equals eager there
    for inputs in (args, other_args()):
        want = fn(*inputs)
        got = gm(*inputs)
        flat_w = torch.utils._pytree.tree_leaves(want)
        flat_g = torch.utils._pytree.tree_leaves(got)
        assert len(flat_w) == len(flat_g)
        for w, g in zip(flat_w, flat_g):
            if isinstance(w, torch.Tensor):
                assert g.shape == w.shape and g.dtype == w.dtype
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
            else:
                assert g == w


def test_symbolic_trace_is_repeatable():
    # a second and third trace of the same program (warm fake-tensor and op caches) give the
    # same graph and ShapeEnv as the first and as torch's
    fn, make_args, _ = PROGRAMS["attention"]
    args = make_args()
    states = [(gm.code, shape_state(gm))
              for gm in (assert_same_as_torch(fn, args, "symbolic") for _ in range(3))]
    assert states[0] == states[1] == states[2]


def test_fast_cache_key_flattening_equals_torchs(monkeypatch):
    # make_fx's fake modes flatten the dispatch-cache key's arguments with their own code
    # (fake_cache._prep_args_for_hash): every key of these traces, and the symbols it saw, must
    # be the ones torch's own flattening gives for the same op and arguments
    from torch._subclasses import fake_tensor as ft
    from torch._subclasses._fake_tensor_utils import _CacheKeyState

    from ferrodyn.proxy_dispatch import make_fx

    cache_key = ft.FakeTensorMode._cache_key
    compared = []

    def checked(self, state, func, args, kwargs):
        def torchs():
            fast = vars(self).pop("_prep_args_for_hash")
            try:
                s = _CacheKeyState(self.shape_env)
                return s, cache_key(self, s, func, args, kwargs)
            finally:
                self._prep_args_for_hash = fast

        if "_prep_args_for_hash" not in vars(self):
            return cache_key(self, state, func, args, kwargs)
        try:
            key = cache_key(self, state, func, args, kwargs)
        except ft._BypassDispatchCache as e:
            with pytest.raises(ft._BypassDispatchCache) as want:
                torchs()
            assert want.value.reason == e.reason
            raise
        s, want = torchs()
        assert key.key == want.key
        assert [type(v) for v in key.key] == [type(v) for v in want.key]
        assert (state.sym_node_lookup, state.known_symbols) == (s.sym_node_lookup, s.known_symbols)
        compared.append(func)
        return key

    monkeypatch.setattr(ft.FakeTensorMode, "_cache_key", checked)
    for fn, make_args, _ in PROGRAMS.values():
        for mode in ("fake", "symbolic"):
            make_fx(fn, tracing_mode=mode)(*make_args())
    assert len(compared) > 300

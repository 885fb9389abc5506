"""A zoo of small, realistic model code for differential tests of ferrodyn.compile (test_models.py).

Owns the models (written here, nothing downloaded), their example inputs in two shapes (the
second shape forces a recompile), and `run_case`, the one differential routine: compiled vs eager
on the same inputs and RNG seed, over a first call (capture), a second call (cache hit) and a
call with the other shape (recompile), then after an optional state change (a config flag
flipped, train/eval switched). It also counts graphs: ferrodyn's through a counting backend and
torch.compile's through `torch._dynamo.testing.CompileCounter`. Does not own expectations (which
models are captured as one graph today): those are in test_models.py.

Run it as a script to print the comparison table (ferrodyn graphs, torch.compile graphs, the
reason a frame ran eagerly):

    PYTHONPATH=python:tests .venv/bin/python tests/models_zoo.py [name ...]
"""

from __future__ import annotations

import copy
import math
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Vision: ResNet-style basic blocks with BatchNorm
# ---------------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return F.relu(out + identity)


class TinyResNet(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, stride=2), BasicBlock(16, 16))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


# ---------------------------------------------------------------------------------------------
# Language: a GPT-style decoder (LayerNorm, causal attention via triu/masked_fill, GELU, MLP)
# ---------------------------------------------------------------------------------------------


class CausalAttention(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        hd = C // self.n_head
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class DecoderBlock(nn.Module):
    def __init__(self, d=32, n_head=4):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalAttention(d, n_head)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, d=32, n_layer=2, block_size=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList([DecoderBlock(d) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


# ---------------------------------------------------------------------------------------------
# torch.nn transformer layers
# ---------------------------------------------------------------------------------------------


class EncoderStack(nn.Module):
    def __init__(self, d=32, nhead=4, layers=2, dropout=0.1):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, nhead, dim_feedforward=64, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)

    def forward(self, x, padding_mask):
        return self.encoder(x, src_key_padding_mask=padding_mask)


class SelfAttention(nn.Module):
    def __init__(self, d=32, nhead=4):
        super().__init__()
        self.mha = nn.MultiheadAttention(d, nhead, batch_first=True)

    def forward(self, x, key_padding_mask):
        out, weights = self.mha(x, x, x, key_padding_mask=key_padding_mask, need_weights=True)
        return out, weights


# ---------------------------------------------------------------------------------------------
# A recurrent cell unrolled by a Python loop (no nn.RNN/LSTM)
# ---------------------------------------------------------------------------------------------


class GRUishCell(nn.Module):
    def __init__(self, din, dh):
        super().__init__()
        self.x2h = nn.Linear(din, 3 * dh)
        self.h2h = nn.Linear(dh, 3 * dh)

    def forward(self, x, h):
        xr, xz, xn = self.x2h(x).chunk(3, -1)
        hr, hz, hn = self.h2h(h).chunk(3, -1)
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return (1 - z) * n + z * h


class UnrolledRNN(nn.Module):
    def __init__(self, din=8, dh=16, dout=4):
        super().__init__()
        self.dh = dh
        self.cell = GRUishCell(din, dh)
        self.head = nn.Linear(dh, dout)

    def forward(self, xs):  # (T, B, din)
        h = xs.new_zeros(xs.shape[1], self.dh)
        outs = []
        for t in range(xs.shape[0]):
            h = self.cell(xs[t], h)
            outs.append(h)
        return self.head(torch.stack(outs)), h


# ---------------------------------------------------------------------------------------------
# MLPs, routing, functional code, structured outputs
# ---------------------------------------------------------------------------------------------


def make_mlp(p=0.3):
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, 32), nn.Tanh(),
                         nn.Dropout(p), nn.Linear(32, 4))


@dataclass
class RouterConfig:
    head: str = "cls"
    residual: bool = True


class Router(nn.Module):
    """Picks a head from a ModuleDict by a config flag read at trace time."""

    def __init__(self, cfg: RouterConfig):
        super().__init__()
        self.cfg = cfg
        self.body = nn.Linear(16, 16)
        self.heads = nn.ModuleDict({
            "cls": nn.Linear(16, 3),
            "reg": nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1)),
        })

    def forward(self, x):
        h = torch.relu(self.body(x))
        if self.cfg.residual:
            h = h + x
        return self.heads[self.cfg.head](h)


def masked_attention(q, k, v, mask):
    """Plain functional code: einsum, torch.where on a boolean mask."""
    scale = q.shape[-1] ** -0.5
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    s = torch.where(mask, s, torch.full_like(s, -1e9))
    p = s.softmax(dim=-1)
    out = torch.einsum("bhqk,bhkd->bhqd", p, v)
    return torch.where(out.abs() > 1e-3, out, torch.zeros_like(out))


class DictOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(16, 8)
        self.cls = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.enc(x))
        logits = self.cls(h)
        return {"logits": logits, "probs": logits.softmax(-1), "stats": [h.mean(), h.std()], "dim": h.shape[-1]}


Prediction = namedtuple("Prediction", ["logits", "features"])


class NamedTupleOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 8), nn.SiLU())
        self.cls = nn.Linear(8, 3)

    def forward(self, x):
        h = self.enc(x)
        return Prediction(logits=self.cls(h), features=h)


class MixedStack(nn.Module):
    """isinstance dispatch while looping over a ModuleList."""

    def __init__(self, d=16):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, d), nn.LayerNorm(d), nn.ReLU(), nn.Linear(d, 2 * d),
                                     nn.GELU(), nn.Linear(2 * d, d), nn.Dropout(0.2), nn.Identity()])

    def forward(self, x):
        skip = x
        for i, layer in enumerate(self.layers):
            if isinstance(layer, nn.Linear):
                x = layer(x)
                if layer.in_features == layer.out_features:
                    x = x + skip
                    skip = x
            elif isinstance(layer, (nn.LayerNorm, nn.Dropout)):
                x = layer(x) * (1.0 + 0.1 * i)
            else:
                x = layer(x)
        return x


class RunningStats(nn.Module):
    """A buffer updated in place in training mode (like BatchNorm's running mean)."""

    def __init__(self, d=16):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
                self.steps.add_(1)
        return self.lin(x - self.running_mean)


class BagClassifier(nn.Module):
    """Token embedding, masked mean pooling, classifier."""

    def __init__(self, vocab=100, d=16, classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.fc = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, classes))

    def forward(self, tokens):
        mask = (tokens != 0).unsqueeze(-1).to(self.emb.weight.dtype)
        e = self.emb(tokens) * mask
        pooled = e.sum(1) / mask.sum(1).clamp(min=1.0)
        return self.fc(pooled)


class AudioConvNet(nn.Module):
    """1-D conv stack over a waveform: strided convs, BatchNorm1d, pooling, global average."""

    def __init__(self, classes=6):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 8, 9, stride=2, padding=4), nn.BatchNorm1d(8), nn.ReLU(),
            nn.Conv1d(8, 16, 5, stride=2, padding=2), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 16, 3, padding=1, groups=4), nn.GroupNorm(4, 16), nn.ReLU(),
        )
        self.fc = nn.Linear(16, classes)

    def forward(self, wav):  # (B, samples)
        x = self.features(wav.unsqueeze(1))
        return self.fc(x.mean(dim=-1))


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=_g(seed))


def _padding_mask(b, t, seed):
    lengths = torch.randint(t // 2, t + 1, (b,), generator=_g(seed))
    return torch.arange(t)[None, :] >= lengths[:, None]  # True = padded


def _tokens(b, t, vocab, seed, pad=False):
    toks = torch.randint(1, vocab, (b, t), generator=_g(seed))
    if pad:
        toks[:, t - 2:] = 0
    return toks


@dataclass
class Case:
    """One zoo entry.

    build: a fresh model or function (parameters from a fixed seed).
    inputs(variant, seed): example arguments; variant 0 and 1 differ in shape.
    train: put a module in training mode (else eval).
    random: the forward draws random numbers (both runs are given the same seed).
    grad: gradients are compared (loss = sum of the float tensor outputs).
    change: an optional state change applied to both models before a last call
        (a config flag flipped, train/eval switched): the guards must notice it.
    """

    name: str
    build: Callable[[], Any]
    inputs: Callable[[int, int], tuple]
    train: bool = False
    random: bool = False
    grad: bool = False
    change: Callable[[Any], None] | None = None
    atol: float = 1e-5
    rtol: float = 1.3e-6


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        return fn()
    return build


def _flip_router(model):
    model.cfg.head = "reg"
    model.cfg.residual = False


CASES: list[Case] = [
    Case("resnet_eval", _seeded(TinyResNet),
         lambda v, s: (_randn(*((2, 3, 16, 16), (3, 3, 12, 12))[v], seed=s),), atol=1e-4, rtol=1e-4),
    Case("resnet_train", _seeded(TinyResNet),
         lambda v, s: (_randn(*((2, 3, 16, 16), (3, 3, 12, 12))[v], seed=s),),
         train=True, grad=True, change=lambda m: m.eval(), atol=1e-4, rtol=1e-4),
    Case("resnet_block_train", _seeded(lambda: BasicBlock(4, 8, stride=2)),
         lambda v, s: (_randn(*((2, 4, 8, 8), (3, 4, 6, 6))[v], seed=s),),
         train=True, grad=True, change=lambda m: m.eval(), atol=1e-4, rtol=1e-4),
    Case("gpt_decoder", _seeded(TinyGPT),
         lambda v, s: (_tokens(2, (8, 12)[v], 50, s), _tokens(2, (8, 12)[v], 50, s + 1)),
         grad=True, atol=1e-4, rtol=1e-4),
    Case("gpt_block", _seeded(DecoderBlock),
         lambda v, s: (_randn(2, (8, 5)[v], 32, seed=s),), atol=1e-4, rtol=1e-4),
    Case("transformer_encoder_layer",
         _seeded(lambda: nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)),
         lambda v, s: (_randn(2, (6, 9)[v], 32, seed=s),), train=True, grad=True, atol=1e-4, rtol=1e-4),
    Case("transformer_encoder", _seeded(EncoderStack),
         lambda v, s: (_randn(3, (6, 9)[v], 32, seed=s), _padding_mask(3, (6, 9)[v], s)), atol=1e-4, rtol=1e-4),
    Case("transformer_encoder_dropout_train", _seeded(EncoderStack),
         lambda v, s: (_randn(3, (6, 9)[v], 32, seed=s), _padding_mask(3, (6, 9)[v], s)),
         train=True, random=True, atol=1e-4, rtol=1e-4),
    Case("multihead_attention", _seeded(SelfAttention),
         lambda v, s: (_randn(2, (5, 7)[v], 32, seed=s), _padding_mask(2, (5, 7)[v], s)), atol=1e-4, rtol=1e-4),
    Case("rnn_cell_loop", _seeded(UnrolledRNN),
         lambda v, s: (_randn((6, 5)[v], 3, 8, seed=s),), grad=True, atol=1e-4, rtol=1e-4),
    Case("mlp_dropout_eval", _seeded(make_mlp), lambda v, s: (_randn((4, 7)[v], 16, seed=s),)),
    Case("mlp_dropout_train", _seeded(make_mlp), lambda v, s: (_randn((4, 7)[v], 16, seed=s),),
         train=True, random=True, grad=True),
    Case("moduledict_router", _seeded(lambda: Router(RouterConfig())),
         lambda v, s: (_randn((4, 6)[v], 16, seed=s),), change=_flip_router),
    Case("functional_where_einsum", lambda: masked_attention,
         lambda v, s: (_randn(2, 2, (4, 6)[v], 8, seed=s), _randn(2, 2, (5, 3)[v], 8, seed=s + 1),
                       _randn(2, 2, (5, 3)[v], 8, seed=s + 2),
                       _randn(2, 2, (4, 6)[v], (5, 3)[v], seed=s + 3) > -0.5)),
    Case("dict_output", _seeded(DictOutput), lambda v, s: (_randn((4, 6)[v], 16, seed=s),)),
    Case("namedtuple_output", _seeded(NamedTupleOutput), lambda v, s: (_randn((4, 6)[v], 16, seed=s),)),
    Case("isinstance_modulelist", _seeded(MixedStack), lambda v, s: (_randn((4, 6)[v], 16, seed=s),),
         change=lambda m: m.train()),
    Case("buffer_inplace_update", _seeded(RunningStats), lambda v, s: (_randn((4, 6)[v], 16, seed=s),),
         train=True, change=lambda m: m.eval()),
    Case("embedding_bag_classifier", _seeded(BagClassifier),
         lambda v, s: (_tokens((3, 4)[v], (7, 10)[v], 100, s, pad=True),)),
    Case("conv1d_audio", _seeded(AudioConvNet), lambda v, s: (_randn(2, (400, 320)[v], seed=s),),
         atol=1e-4, rtol=1e-4),
]

CASES_BY_NAME = {c.name: c for c in CASES}


# ---------------------------------------------------------------------------------------------
# The differential routine
# ---------------------------------------------------------------------------------------------


class CountingBackend:
    """Counts the graphs handed to it and compiles each with the wrapped backend."""

    def __init__(self, inner: str = "eager"):
        from ferrodyn.backends import lookup_backend

        self.inner_name = inner
        self.inner = lookup_backend(inner)
        self.graphs: list[torch.fx.GraphModule] = []
        self.__name__ = f"counting_{inner}"

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return self.inner(gm, example_inputs)

    @property
    def count(self) -> int:
        return len(self.graphs)


def _tensors(out) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(out)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _loss(out) -> torch.Tensor:
    return sum(t.float().sum() for t in _tensors(out) if t.is_floating_point() and t.requires_grad)


def assert_same(got, want, case: Case, what: str) -> None:
    """Same structure and types, equal values (tensors with the case's tolerance)."""
    assert type(got) is type(want), f"{case.name} {what}: {type(got).__name__} != {type(want).__name__}"
    g_leaves, g_spec = torch.utils._pytree.tree_flatten(got)
    w_leaves, w_spec = torch.utils._pytree.tree_flatten(want)
    assert g_spec == w_spec, f"{case.name} {what}: output structure {g_spec} != {w_spec}"
    for a, b in zip(g_leaves, w_leaves):
        assert type(a) is type(b), f"{case.name} {what}: leaf {type(a).__name__} != {type(b).__name__}"
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, atol=case.atol, rtol=case.rtol, equal_nan=True,
                                       msg=lambda m: f"{case.name} {what}: {m}")
        else:
            assert a == b, f"{case.name} {what}: {a!r} != {b!r}"


def _prepare(case: Case):
    eager = case.build()
    if isinstance(eager, nn.Module):
        eager.train(case.train)
    other = copy.deepcopy(eager) if isinstance(eager, nn.Module) else eager
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
        args = case.inputs(variant, seed)
        torch.manual_seed(100 + seed)
        want = eager(*args)
        torch.manual_seed(100 + seed)
        got = compiled(*args)
        assert_same(got, want, case, f"[{step}] output")
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
    compiled(*case.inputs(0, 0))
    torch._dynamo.reset()
    return cnt.frame_count


def eager_reasons(case: Case) -> list[str]:
    """ferrodyn.explain's reasons for frames that ran eagerly on the first call."""
    import ferrodyn

    model = case.build()
    if isinstance(model, nn.Module):
        model.train(case.train)
    torch.manual_seed(100)
    out = ferrodyn.explain(model)(*case.inputs(0, 0))
    ferrodyn.reset()
    return list(out.break_reasons)


def _main(names: list[str]) -> None:
    rows = [("model", "ferrodyn graphs", "torch.compile graphs", "correct?", "reason if eager")]
    for case in [CASES_BY_NAME[n] for n in names] if names else CASES:
        try:
            rep, _ = ferrodyn_run(case, grad=case.grad)
            ok, fd = "yes", str(rep.graphs_first)
        except AssertionError as e:
            ok, fd = f"NO: {str(e).splitlines()[0][:80]}", "?"
        except Exception as e:  # a crash is reported, not hidden
            ok, fd = f"CRASH: {type(e).__name__}: {str(e).splitlines()[0][:80]}", "?"
        tc = torch_graph_count(case)
        reasons = eager_reasons(case)
        why = "; ".join(r.split("\n")[0] for r in reasons)[:300]
        rows.append((case.name, fd, str(tc), ok, why))
    for r in rows:
        print(" | ".join(r))


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])

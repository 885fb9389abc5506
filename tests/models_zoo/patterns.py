"""Python patterns of model code in the zoo: MLPs with dropout, config-flag routing through a
ModuleDict, functional einsum/where code, dict/namedtuple outputs, isinstance over a
ModuleList, in-place buffer updates, a VAE, mixtures of experts (dense and data-dependent),
super().forward, forward hooks, no_grad teachers, autocast, .item(), logging, label smoothing.
Models only: inputs and expectations are in cases.py and test_models.py."""

from __future__ import annotations

import logging
from collections import namedtuple
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

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




class VAE(nn.Module):
    """Reparameterisation with torch.randn_like; returns the loss with its parts."""

    def __init__(self, d=16, z=4):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 32), nn.ReLU())
        self.mu = nn.Linear(32, z)
        self.logvar = nn.Linear(32, z)
        self.dec = nn.Sequential(nn.Linear(z, 32), nn.ReLU(), nn.Linear(32, d))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        zs = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        recon = self.dec(zs)
        rec = F.binary_cross_entropy_with_logits(recon, torch.sigmoid(x), reduction="sum")
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return rec + kl, recon, mu, logvar


class DenseMoE(nn.Module):
    """Top-2 routing computed densely: topk, scatter into a gate matrix, a generator expression
    summing every expert's weighted output."""

    def __init__(self, d=16, experts=4):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))
                                      for _ in range(experts)])

    def forward(self, x):
        logits = self.router(x)
        w, idx = logits.topk(2, dim=-1)
        gates = torch.zeros_like(logits).scatter(-1, idx, w.softmax(-1))
        return sum(gates[:, i:i + 1] * expert(x) for i, expert in enumerate(self.experts))


class SparseMoE(nn.Module):
    """Top-1 routing with data-dependent dispatch (torch.where on the routing mask, index_add_):
    the shapes depend on tensor values."""

    def __init__(self, d=16, experts=3):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(experts)])

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            rows = torch.where(choice == i)[0]
            out.index_add_(0, rows, expert(x[rows]))
        return out



class ScaledLinear(nn.Linear):
    """A subclass whose forward calls super().forward (zero-argument super: a __class__ cell)."""

    def __init__(self, din, dout, scale=0.5):
        super().__init__(din, dout)
        self.scale = scale

    def forward(self, x):
        return super().forward(x) * self.scale


class SuperForwardNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = ScaledLinear(16, 16)
        self.b = ScaledLinear(16, 4, scale=2.0)

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


class FeatureTap(nn.Module):
    """Forward hooks that store intermediate activations in a dict (feature extraction). The
    dict's keys exist from the start (an empty dict would change its key set on the first call:
    a recompile on the second call, in torch.compile too)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 2)
        self.features = {"relu": None, "body": None}
        self.body[1].register_forward_hook(self._save("relu"))
        self.body.register_forward_hook(self._save("body"))

    def _save(self, name):
        def hook(module, inputs, output):
            self.features[name] = output.detach()
        return hook

    def forward(self, x):
        out = self.head(self.body(x))
        return out, self.features["relu"] * 1, self.features["body"] * 1


class TeacherStudent(nn.Module):
    """A frozen teacher under torch.no_grad, a student, a cosine distillation loss."""

    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 8))
        self.teacher = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 8))
        for p in self.teacher.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        s = self.student(x)
        with torch.no_grad():
            t = self.teacher(x).detach()
        loss = 1 - F.cosine_similarity(s, t, dim=-1).mean()
        return loss, s


class AutocastHead(nn.Module):
    """A bfloat16 autocast region on CPU, cast back to float32."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = F.relu(self.fc1(x))
            y = self.fc2(h)
        return y.float()


class ItemNormalizer(nn.Module):
    """Reads a Python float off a tensor (.item()) and uses it in Python arithmetic."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        scale = x.abs().max().item()
        return self.fc(x / (scale + 1e-6))


_zoo_log = logging.getLogger("models_zoo")


class LoggingModel(nn.Module):
    """Logs shapes with the logging module in forward (a no-op at the default level)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        _zoo_log.debug("input shape %s", tuple(x.shape))
        return self.fc(x)


class LabelSmoothingLoss(nn.Module):
    """one_hot targets, label smoothing by hand, and cross_entropy's own label_smoothing."""

    def __init__(self, classes=5):
        super().__init__()
        self.classes = classes
        self.fc = nn.Linear(16, classes)

    def forward(self, x, labels):
        logits = self.fc(x)
        target = F.one_hot(labels, num_classes=self.classes).float() * 0.9 + 0.1 / self.classes
        manual = torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()
        builtin = F.cross_entropy(logits, labels, label_smoothing=0.1)
        return manual, builtin


class InputInPlace(nn.Module):
    """Mutates its input in place (clamp_, masked_fill_) before using it: the caller sees it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x, mask):
        x.clamp_(-1.0, 1.0)
        x.masked_fill_(mask, 0.0)
        return self.fc(x)


class TiedGPT(nn.Module):
    """GPT-2's weight tying: the output head shares the token embedding's parameter."""

    def __init__(self, vocab=40, d=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        return self.head(self.ln(torch.tanh(self.tok(idx))))


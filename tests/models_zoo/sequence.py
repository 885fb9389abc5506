"""Sequence models of the zoo: a GPT-style decoder, torch.nn transformer layers and
MultiheadAttention, an unrolled GRU-like cell, nn.GRU, rotary attention with SDPA, a
transformers-style encoder (keyword flags, dataclass output), an embedding-bag classifier.
Models only: inputs and expectations are in cases.py and test_models.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


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





@dataclass
class EncoderOutput:
    """An output record in the style of transformers' ModelOutput (a dataclass, optional fields)."""

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple | None = None


class HFStyleEncoder(nn.Module):
    """Keyword-heavy forward: optional attention mask, flags, **kwargs, an extended additive mask
    from torch.finfo, hidden states accumulated in a tuple, a dataclass output."""

    def __init__(self, vocab=60, d=32, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
                                     for _ in range(layers)])
        self.pool = nn.Linear(d, d)

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False, return_dict=True, **kwargs):
        h = self.emb(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        additive = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        additive = additive.expand(-1, 4, input_ids.shape[1], -1).reshape(-1, input_ids.shape[1], input_ids.shape[1])
        all_hidden = () if output_hidden_states else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden = all_hidden + (h,)
            h = layer(h, src_mask=additive)
        pooled = torch.tanh(self.pool(h[:, 0]))
        if not return_dict:
            return (h, pooled)
        return EncoderOutput(last_hidden_state=h, pooler_output=pooled, hidden_states=all_hidden)



class GRUClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 16, num_layers=1, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        out, h = self.gru(x)
        return self.fc(out[:, -1]), h


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryAttention(nn.Module):
    """Rotary position embeddings (outer product, cos/sin, rotate_half) and
    F.scaled_dot_product_attention with is_causal."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        hd = d // heads
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        freqs = torch.outer(torch.arange(t, dtype=x.dtype), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class BertStyleSelfAttention(nn.Module):
    """transformers' BERT idioms: transpose_for_scores with `x.size()[:-1] + (heads, dim)`,
    layers indexed by `range(len(self.layers))`, an additive attention mask."""

    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.layers = nn.ModuleList([nn.ModuleDict({"q": nn.Linear(d, d), "k": nn.Linear(d, d),
                                                    "v": nn.Linear(d, d), "o": nn.Linear(d, d)})
                                     for _ in range(layers)])

    def transpose_for_scores(self, x):
        new_shape = x.size()[:-1] + (self.heads, self.hd)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden, mask):
        additive = (1.0 - mask[:, None, None, :].float()) * -10000.0
        for i in range(len(self.layers)):
            layer = self.layers[i]
            q = self.transpose_for_scores(layer["q"](hidden))
            k = self.transpose_for_scores(layer["k"](hidden))
            v = self.transpose_for_scores(layer["v"](hidden))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd) + additive
            ctx = torch.matmul(nn.functional.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            ctx = ctx.view(ctx.size()[:-2] + (self.heads * self.hd,))
            hidden = hidden + layer["o"](ctx)
        return hidden


class GreedyGenerator(nn.Module):
    """Greedy decoding: a @torch.no_grad() forward that grows the sequence with torch.cat over a
    fixed number of steps (shapes change inside the frame)."""

    def __init__(self, steps=3):
        super().__init__()
        self.steps = steps
        self.gpt = TinyGPT(n_layer=1, block_size=24)

    @torch.no_grad()
    def forward(self, idx):
        for _ in range(self.steps):
            logits = self.gpt(idx[:, -16:])
            nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


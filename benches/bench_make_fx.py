"""make_fx tracing time: ferrodyn.make_fx against torch's make_fx on the same programs, in each
tracing mode, as medians of interleaved rounds measured in one process.

    PYTHONPATH=python .venv/bin/python benches/run.py --group make_fx
"""

from __future__ import annotations

import math
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx as torch_make_fx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from timing import interleaved_ns  # noqa: E402

from ferrodyn.proxy_dispatch import make_fx  # noqa: E402

GROUP = "make_fx"


def _programs():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10),
    ).eval()
    enc = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64).eval()
    deep = torch.nn.Sequential(
        *[m for _ in range(12) for m in (torch.nn.Linear(32, 32), torch.nn.ReLU())]
    )

    def attention(q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(s, dim=-1) @ v, F.scaled_dot_product_attention(q, k, v)

    def pointwise(x):
        for _ in range(20):
            x = torch.relu(x * 1.5 + 0.1)
        return x

    qkv = tuple(torch.randn(2, 4, 16, 8) for _ in range(3))
    return {
        "mlp": (lambda x: mlp(x), (torch.randn(8, 32),)),
        "convnet": (lambda x: conv(x), (torch.randn(2, 3, 16, 16),)),
        "attention": (attention, qkv),
        "transformer_encoder": (lambda x: enc(x), (torch.randn(6, 2, 32),)),
        "pointwise_x20": (pointwise, (torch.randn(16, 16),)),
        "deep_mlp_x12": (lambda x: deep(x), (torch.randn(8, 32),)),
    }


def run(rounds: int = 7) -> list[dict]:
    rows = []
    for name, (fn, args) in _programs().items():
        for mode in ("real", "fake", "symbolic"):
            def ours(fn=fn, args=args, mode=mode):
                make_fx(fn, tracing_mode=mode)(*args)

            def ref(fn=fn, args=args, mode=mode):
                torch_make_fx(fn, tracing_mode=mode, _allow_non_fake_inputs=True)(*args)

            ours(), ref()  # warm caches (op tables, fake-tensor caches) for both
            t = interleaved_ns({"ferrodyn": ours, "torch": ref}, inner=1, rounds=rounds)
            rows.append({
                "case": f"{name}/{mode}",
                "ferrodyn": t["ferrodyn"] / 1e3,
                "reference": t["torch"] / 1e3,
                "unit": "us",
                "reference_name": "torch make_fx",
            })
    return rows


if __name__ == "__main__":
    for r in run():
        print(f"{r['case']:<32} {r['ferrodyn']:>10.0f} {r['reference']:>10.0f}  "
              f"{r['ferrodyn'] / r['reference']:.3f}")

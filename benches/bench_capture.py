"""First-call capture time with backend="eager": a fresh compile and its first call (trace,
guards, codegen, and running it), ferrodyn vs torch.compile, on an 8-layer MLP,
nn.TransformerEncoderLayer, a small CNN and a 50-step Python loop. Both are reset between
rounds (ferrodyn.reset(), torch._dynamo.reset()); rounds alternate; medians."""

from __future__ import annotations

import statistics
import time

import torch

from workloads import MLP

GROUP = "capture"


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))



def python_loop(x):
    for i in range(50):
        x = x * 0.5 + i
    return x


def cases():
    torch.manual_seed(0)
    return {
        "8-layer MLP": (MLP().eval(), (torch.randn(16, 64),)),
        "TransformerEncoderLayer": (torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval(),
                                    (torch.randn(2, 10, 64),)),
        "small CNN": (SmallCNN().eval(), (torch.randn(2, 3, 16, 16),)),
        "50-step Python loop": (python_loop, (torch.randn(8),)),
    }


def first_call_s(compile_fn, reset, model, args) -> float:
    reset()
    t0 = time.perf_counter()
    compiled = compile_fn(model, backend="eager")
    compiled(*args)
    return time.perf_counter() - t0


def run(rounds: int = 5) -> list[dict]:
    import torch._dynamo

    import ferrodyn

    rows = []
    with torch.no_grad():
        for name, (model, args) in cases().items():
            fd, tc = [], []
            for _ in range(rounds):
                fd.append(first_call_s(ferrodyn.compile, ferrodyn.reset, model, args))
                tc.append(first_call_s(torch.compile, torch._dynamo.reset, model, args))
            report = ferrodyn.explain(model)(*args)
            case = name if report.graph_count else f"{name} [ferrodyn ran eagerly]"
            rows.append({"case": case, "ferrodyn": statistics.median(fd) * 1e3,
                         "reference": statistics.median(tc) * 1e3, "unit": "ms",
                         "reference_name": "torch.compile", "graphs": report.graph_count})
    ferrodyn.reset()
    torch._dynamo.reset()
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)

"""Model code the bench modules share (so each workload is defined once)."""

from __future__ import annotations

import torch


class MLP(torch.nn.Module):
    """`depth` Linear + ReLU layers of `width` features, in a ModuleList."""

    def __init__(self, width: int = 64, depth: int = 8):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x

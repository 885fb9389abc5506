"""A backend for tests that records every graph handed to it and compiles each with a real
backend (ferrodyn's "eager" unless told otherwise): `count` is the number of graphs compiled."""

from __future__ import annotations

import torch


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

"""The built-in backends: "eager", "inductor" and "aot_eager".

Owns only their definitions (each is `(gm, example_inputs, **kwargs) -> callable`); the registry
is in `__init__.py`. Inductor and AOT autograd are torch's own; ferrodyn adds nothing to them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.fx


def eager(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """Run the captured graph as it is (its generated `forward`, without nn.Module.__call__)."""
    return gm.forward


def inductor(gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None,
             options: dict | None = None, **kwargs: Any) -> Callable[..., Any]:
    """torch's Inductor (`torch._inductor.compile_fx.compile_fx`), with torch.compile's handling
    of `mode` and `options`."""
    import torch

    return torch._TorchCompileInductorWrapper(mode, options, None)(gm, example_inputs)


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """torch's AOT autograd (forward and backward traced to aten graphs), run eagerly."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def boxed_nop(fx_g: torch.fx.GraphModule, _inputs: list[Any]) -> Callable[..., Any]:
        return make_boxed_func(fx_g.forward)

    return aot_autograd(fw_compiler=boxed_nop)(gm, example_inputs)


BUILTINS = {"eager": eager, "inductor": inductor, "aot_eager": aot_eager}

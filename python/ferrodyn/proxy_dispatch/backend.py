"""The `aten_eager` backend: lower a captured graph to aten with `ferrodyn.make_fx` and run it.

Owns: `aten_eager(gm, example_inputs)` (a backend in the `torch.compile` convention, usable by
`ferrodyn.compile` and `torch.compile`) and its registration under the name "aten_eager" in
torch's backend registry (done once, when this module is imported; importing it again does
nothing). Inference only: the aten graph is traced without an autograd graph; running it on
tensors that require grad still works, because each aten op records autograd when it runs.

Does not own: tracing (make_fx.py) or ferrodyn's own backend table (ferrodyn.backends).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ferrodyn.proxy_dispatch.make_fx import make_fx

BACKEND_NAME = "aten_eager"


def _tracing_mode(example_inputs) -> str:
    """Symbolic if the inputs carry symbolic sizes, else fake: tracing on fake values never runs
    kernels (no compute, no RNG consumed) whatever the inputs are."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return "symbolic"
        if isinstance(x, Tensor) and any(not isinstance(s, int) for s in x.shape):
            return "symbolic"
    return "fake"


def aten_eager(gm: torch.fx.GraphModule, example_inputs, *, mode=None, options=None):
    """Trace `gm` on `example_inputs` down to aten ops and return the aten GraphModule (called
    with the same arguments as `gm`). It has no modes or options: giving any is an error."""
    if mode is not None or options:
        raise TypeError(f"aten_eager takes no mode or options (got mode={mode!r}, options={options!r})")
    with torch.no_grad():
        aten_gm = make_fx(gm, tracing_mode=_tracing_mode(example_inputs))(*example_inputs)
    return aten_gm


def _register() -> None:
    from torch._dynamo.backends import registry

    if BACKEND_NAME not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=aten_eager, name=BACKEND_NAME)
    try:  # ferrodyn's own table, once it exists
        from ferrodyn import backends as fd_backends
    except ImportError:
        return
    register = getattr(fd_backends, "register_backend", None)
    listed = getattr(fd_backends, "list_backends", lambda: ())
    if register is not None and BACKEND_NAME not in listed():
        register(compiler_fn=aten_eager, name=BACKEND_NAME)


_register()

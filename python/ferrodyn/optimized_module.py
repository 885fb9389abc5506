"""`OptimizedModule`: what `ferrodyn.compile(module)` returns.

Owns the module wrapper: it is an `nn.Module` whose `forward` is the original module's
`__call__` under ferrodyn's frame callback, so the original's forward pre/post hooks run as
usual while its `forward` frame is captured. Calling the wrapper enters `_C.ModuleCall`, which
skips both `nn.Module.__call__` layers when neither module (nor torch globally) has hooks. Attribute reads and writes, `state_dict`,
`parameters()`, `named_modules()`, `train()`/`eval()` and `len()` go to the original module
(state-dict keys are the original's, without an `_orig_mod.` prefix). Does not own the compile
pipeline (convert_frame.py) or the per-call wrapper (eval_frame.py).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from ferrodyn import _C, convert_frame
from ferrodyn.eval_frame import DisableContext, wrap_compiled
from torch.nn.modules.lazy import LazyModuleMixin


def _inline_frame(mod: torch.nn.Module) -> Callable[..., Any]:
    """A function `(*args, **kwargs) -> mod(*args, **kwargs)` with its own code object, traced
    even though it lives in a ferrodyn file: the capturable frame for modules whose `forward`
    is torch's own (nn.Linear, nn.TransformerEncoderLayer, ...), which are never traced as
    frames of their own."""

    def make(mod):
        def call_module(*args, **kwargs):
            return mod(*args, **kwargs)
        return call_module

    fn = make(mod)
    # A private code object per module, so each module has its own cache.
    fn.__code__ = fn.__code__.replace(co_name=f"{type(mod).__name__}_call")
    convert_frame.always_trace(fn.__code__)
    return fn


# Attributes that live on the wrapper itself; everything else goes to the original module.
_OWN = frozenset({"_orig_mod", "forward", "_ferrodyn_options", "_super_module_initialized", "__dict__",
                  "_ferrodyn_call"})


def _initialize_first(mod: torch.nn.Module, target: Callable[..., Any]) -> Callable[..., Any]:
    """`target` (the lazy module's `__call__`) after running the module's lazy-initialization
    pre-hook uncaptured, as `_call_impl` would run it first: `initialize_parameters` is the
    module's set-up code (it materializes parameters), never a graph of its own. Only while
    that hook is the sole forward pre-hook (module and global): otherwise `_call_impl` runs
    the hooks in order, each captured as usual."""
    from torch.nn.modules import module as _mm

    def call(*args: Any, **kwargs: Any) -> Any:
        handle = getattr(mod, "_initialize_hook", None)
        if handle is not None and list(mod._forward_pre_hooks) == [handle.id] and \
                not _mm._global_forward_pre_hooks:
            with DisableContext():
                mod._infer_parameters(mod, args, kwargs)
        return target(*args, **kwargs)
    return call


class OptimizedModule(torch.nn.Module):
    """A compiled `nn.Module` (see the module docstring)."""

    _orig_mod: torch.nn.Module

    def __init__(self, mod: torch.nn.Module, callback: Any, options: dict | None = None) -> None:
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_super_module_initialized", False)
        super().__init__()
        object.__setattr__(self, "_super_module_initialized", True)
        self._modules["_orig_mod"] = mod
        object.__setattr__(self, "_ferrodyn_options", dict(options or {}))
        forward_code = getattr(getattr(type(mod), "forward", None), "__code__", None)
        inline = forward_code is not None and convert_frame.is_skipped_file(forward_code.co_filename)
        target = _inline_frame(mod) if inline else mod.__call__
        if isinstance(mod, LazyModuleMixin) and not inline:
            target = _initialize_first(mod, target)
        forward = wrap_compiled(target, callback)
        object.__setattr__(self, "forward", forward)
        object.__setattr__(self, "_ferrodyn_call", _C.ModuleCall(self, mod, forward, inline))

    # `opt(x)` enters Rust directly: this instance's `_C.ModuleCall`, which calls the original's
    # `forward` under the callback when no hooks are set anywhere, else nn.Module.__call__.
    __call__ = _C.ModuleCallSlot()

    def __deepcopy__(self, memo: dict) -> "OptimizedModule":
        """A wrapper of a deep copy of the original, under the same callback (its `forward`
        and `ModuleCall` are built for the copy, never shared with this wrapper)."""
        import copy

        callback = getattr(self.__dict__["forward"], "_ferrodyn_callback", None)
        new = OptimizedModule(copy.deepcopy(self._orig_mod, memo), callback, self._ferrodyn_options)
        memo[id(self)] = new
        return new

    # -- forwarding to the original ---------------------------------------------------------
    @property
    def training(self) -> bool:  # type: ignore[override]
        return self._orig_mod.training

    @training.setter
    def training(self, value: bool) -> None:
        if self._super_module_initialized:
            self._orig_mod.training = value

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            return self.__dict__["_orig_mod"]
        return getattr(self.__dict__["_orig_mod"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN or name == "training":
            object.__setattr__(self, name, value)  # `training` is the property above
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if name in _OWN:
            return object.__delattr__(self, name)
        delattr(self._orig_mod, name)

    def __len__(self) -> int:
        return len(self._orig_mod)  # type: ignore[arg-type]

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._orig_mod)) | set(super().__dir__()))

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"

    def train(self, mode: bool = True) -> "OptimizedModule":
        self._orig_mod.train(mode)
        return self

    def eval(self) -> "OptimizedModule":
        return self.train(False)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        return self._orig_mod.parameters(recurse)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return self._orig_mod.named_parameters(*args, **kwargs)

    def buffers(self, recurse: bool = True) -> Iterator[torch.Tensor]:
        return self._orig_mod.buffers(recurse)

    def named_buffers(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.Tensor]]:
        return self._orig_mod.named_buffers(*args, **kwargs)

    def children(self) -> Iterator[torch.nn.Module]:
        return self._orig_mod.children()

    def named_children(self) -> Iterator[tuple[str, torch.nn.Module]]:
        return self._orig_mod.named_children()

    def modules(self) -> Iterator[torch.nn.Module]:
        return self._orig_mod.modules()

    def named_modules(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.nn.Module]]:
        return self._orig_mod.named_modules(*args, **kwargs)

    def to(self, *args: Any, **kwargs: Any) -> "OptimizedModule":
        self._orig_mod.to(*args, **kwargs)
        return self

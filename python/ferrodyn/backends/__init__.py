"""Backend registry: names -> `(gm: torch.fx.GraphModule, example_inputs) -> callable`.

Owns `register_backend`, `list_backends` and `lookup_backend`. Names resolve in this order:
ferrodyn's own registry (built-ins "eager", "inductor", "aot_eager" from `builtin.py`, plus what
users register), lazy entries ("aten_eager" -> ferrodyn.proxy_dispatch.backend), then
torch.compile's registry, so every torch.compile backend name works unchanged. Does not own the
compile pipeline (convert_frame.py) or how options bind to a backend (`bind_backend` below is
only the mode/options plumbing, mirroring torch.compile's wrappers).
"""

from __future__ import annotations

import difflib
import functools
import importlib
from typing import Any, Callable, Sequence

import torch._dynamo.exc as _torch_exc

CompilerFn = Callable[..., Callable[..., Any]]

_COMPILER_FNS: dict[str, CompilerFn] = {}
_TAGS: dict[str, tuple[str, ...]] = {}
# name -> "module:attribute", imported on first lookup (owned by other parts of ferrodyn)
_LAZY: dict[str, str] = {"aten_eager": "ferrodyn.proxy_dispatch.backend:aten_eager"}


class InvalidBackend(_torch_exc.InvalidBackend):
    """An unknown backend name; catchable as torch._dynamo.exc.InvalidBackend."""

    def __init__(self, name: str, suggestions: Sequence[str] = ()) -> None:
        msg = f"Invalid backend: {name!r}"
        msg += f", did you mean: {', '.join(map(repr, suggestions))}?" if suggestions else "."
        msg += " See `ferrodyn.list_backends()` for available backends."
        _torch_exc.TorchDynamoException.__init__(self, msg)
        self.name = name


def register_backend(compiler_fn: CompilerFn | None = None, name: str | None = None,
                     tags: Sequence[str] = ()):
    """Register `compiler_fn` under `name` (default: its `__name__`), like torch's
    `register_backend`; usable as `@register_backend` and `@register_backend(name=...)`."""
    if compiler_fn is None:
        return functools.partial(register_backend, name=name, tags=tags)
    if not callable(compiler_fn):
        raise TypeError(f"register_backend: compiler_fn must be callable, got {type(compiler_fn).__name__}")
    name = name or compiler_fn.__name__
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_backend: name must be a non-empty str, got {name!r}")
    if name in _COMPILER_FNS:
        raise ValueError(f"register_backend: duplicate backend name {name!r}")
    _COMPILER_FNS[name] = compiler_fn
    _TAGS[name] = tuple(tags)
    return compiler_fn


def _torch_names(exclude_tags) -> list[str]:
    from torch._dynamo.backends import registry

    return list(registry.list_backends(exclude_tags=exclude_tags))


def list_backends(exclude_tags: Sequence[str] | None = ("debug", "experimental")) -> list[str]:
    """Every name `ferrodyn.compile(backend=...)` accepts: ferrodyn's and torch.compile's,
    without those tagged with any of `exclude_tags`."""
    _ensure_builtins()
    excl = set(exclude_tags or ())
    names = {n for n, t in _TAGS.items() if not excl.intersection(t)}
    names.update(_LAZY)
    names.update(_torch_names(tuple(excl)))
    return sorted(names)


def lookup_backend(backend: str | CompilerFn) -> CompilerFn:
    """A backend name or callable -> the compiler function. Unknown names raise InvalidBackend."""
    if callable(backend):
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str or a callable, got {type(backend).__name__}")
    _ensure_builtins()
    if backend in _COMPILER_FNS:
        return _COMPILER_FNS[backend]
    if backend in _LAZY:
        mod, _, attr = _LAZY[backend].partition(":")
        try:
            fn = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise InvalidBackend(backend) from e
        _COMPILER_FNS[backend] = fn
        _TAGS[backend] = ()
        return fn
    from torch._dynamo.backends import registry

    try:
        return registry.lookup_backend(backend)
    except _torch_exc.InvalidBackend:
        pass
    suggestions = difflib.get_close_matches(backend, list_backends(exclude_tags=()), n=2)
    raise InvalidBackend(backend, suggestions)


def backend_name(backend: str | CompilerFn) -> str:
    if isinstance(backend, str):
        return backend
    return getattr(backend, "__name__", None) or type(backend).__name__


def bind_backend(backend: str | CompilerFn, *, mode: str | None, options: dict | None,
                 dynamic: bool | None) -> CompilerFn:
    """The compiler function `ferrodyn.compile` will call, with `mode`/`options` bound the way
    torch.compile binds them: Inductor validates them now (torch's own checks and messages);
    any other backend receives them as `mode=`/`options=` keyword arguments."""
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    if backend == "inductor":
        import torch

        return torch._TorchCompileInductorWrapper(mode, dict(options) if options else None, dynamic)
    fn = lookup_backend(backend)
    kwargs: dict[str, Any] = {}
    if mode and mode != "default":
        kwargs["mode"] = mode
    if options:
        kwargs["options"] = dict(options)
    if kwargs:
        bound = functools.partial(fn, **kwargs)
        bound.__name__ = backend_name(backend)  # type: ignore[attr-defined]
        return bound
    return fn


@functools.cache
def _ensure_builtins() -> None:
    from ferrodyn.backends import builtin

    for name, fn in builtin.BUILTINS.items():
        if name not in _COMPILER_FNS:
            register_backend(fn, name=name)

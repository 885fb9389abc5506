"""ferrodyn: TorchDynamo-style graph capture with a Rust hot path.

This module owns the public namespace only. Names are resolved lazily from the module that owns
each (so `import ferrodyn` stays cheap and imports torch only when a name needs it).
"""

from ferrodyn._platform import check_platform as _check_platform

_check_platform()

from ferrodyn import _C  # noqa: E402  (after the platform check, on purpose)

# public name -> owning module
_PUBLIC = {
    "compile": "ferrodyn.api",
    "disable": "ferrodyn.api",
    "reset": "ferrodyn.api",
    "explain": "ferrodyn.api",
    "list_backends": "ferrodyn.backends",
    "register_backend": "ferrodyn.backends",
    "OptimizedModule": "ferrodyn.optimized_module",
    "Unsupported": "ferrodyn.exc",
    "BackendCompilerFailed": "ferrodyn.exc",
    "graph_break": "ferrodyn.exc",
    "make_fx": "ferrodyn.proxy_dispatch",
    "mark_dynamic": "ferrodyn.dynamic",
    "maybe_mark_dynamic": "ferrodyn.dynamic",
    "mark_static": "ferrodyn.dynamic",
}
_SUBMODULES = ("config", "weak")

__all__ = sorted([*_PUBLIC, *_SUBMODULES])


def __getattr__(name: str):
    import importlib

    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"ferrodyn.{name}")
    else:
        raise AttributeError(f"module 'ferrodyn' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return __all__

"""ferrodyn's settings, like `torch._dynamo.config`: plain module attributes.

Owns the user-tunable knobs of the frontend and pushes the ones the Rust core needs into it
(`cache_size_limit` -> `_C.set_cache_size_limit`) the moment they are assigned. Does not own
logging switches (logs.py) or backend choices (backends/).

    import ferrodyn
    ferrodyn.config.cache_size_limit = 4
    with ferrodyn.config.patch(cache_size_limit=2): ...
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types

#: Compiled entries per code object; past it a frame of that code runs eagerly (Rust warns once).
cache_size_limit: int = 8

#: Internal errors of the converter (not `Unsupported`) fall back to eager execution with a logged
#: warning instead of propagating; `fullgraph=True` always propagates them.
suppress_errors: bool = True

#: Extra path prefixes whose code is never traced (like torch's skip files), added to torch's,
#: ferrodyn's, the standard library's and a few numeric libraries'.
skip_file_prefixes: tuple[str, ...] = ()

#: Print a warning (besides the log record) when a frame runs eagerly because it is unsupported.
verbose: bool = False

#: Functions whose calls are reordered after the graph instead of breaking it, like torch's
#: `torch._dynamo.config.reorderable_logging_functions` (e.g. `{print}`): a call whose arguments
#: are all tensors or constants is recorded and run by the entry after the graph (before any
#: later eager code, in program order), its result taken as None. Empty by default: `print`
#: breaks the graph, as in torch.compile. As there, a tensor argument is passed as the graph
#: computed it: an in-place change of that tensor later in the same graph shows in the output.
#: (`logging.Logger` output methods and `warnings.warn` are always replayed this way.)
reorderable_logging_functions: set = set()

_TYPES = {
    "cache_size_limit": int,
    "suppress_errors": bool,
    "skip_file_prefixes": tuple,
    "verbose": bool,
    "reorderable_logging_functions": set,
}


def _push(name: str, value) -> None:
    """Mirror a setting into the Rust core, where it has a counterpart."""
    if name == "cache_size_limit":
        from ferrodyn import _C

        if hasattr(_C, "set_cache_size_limit"):
            _C.set_cache_size_limit(value)
    elif name == "skip_file_prefixes":
        from ferrodyn import convert_frame

        convert_frame.skip_rules_changed()


def _check(name: str, value) -> None:
    want = _TYPES[name]
    if want is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise TypeError(f"ferrodyn.config.{name} must be a non-negative int, got {value!r}")
    if want is bool and not isinstance(value, bool):
        raise TypeError(f"ferrodyn.config.{name} must be a bool, got {type(value).__name__}")
    if want is set and not (isinstance(value, (set, frozenset)) and all(callable(f) for f in value)):
        raise TypeError(f"ferrodyn.config.{name} must be a set of callables, got {value!r}")
    if want is tuple and not (isinstance(value, tuple) and all(isinstance(p, str) for p in value)):
        raise TypeError(f"ferrodyn.config.{name} must be a tuple of str, got {value!r}")


class _ConfigModule(types.ModuleType):
    """The module's class: validates assignments and pushes them into the core."""

    def __setattr__(self, name: str, value) -> None:
        if name in _TYPES:
            _check(name, value)
            super().__setattr__(name, value)
            _push(name, value)
        elif name.startswith("_") or name in self.__dict__:
            super().__setattr__(name, value)
        else:
            raise AttributeError(f"ferrodyn.config has no setting {name!r}; known: {sorted(_TYPES)}")


def settings() -> dict:
    """The current value of every setting."""
    mod = sys.modules[__name__]
    return {name: getattr(mod, name) for name in _TYPES}


def patch(**changes):
    """Context manager (and decorator) setting some settings and restoring them afterwards."""
    mod = sys.modules[__name__]
    for name in changes:
        if name not in _TYPES:
            raise AttributeError(f"ferrodyn.config has no setting {name!r}; known: {sorted(_TYPES)}")

    @contextlib.contextmanager
    def _ctx():
        saved = {name: getattr(mod, name) for name in changes}
        try:
            for name, value in changes.items():
                setattr(mod, name, value)
            yield
        finally:
            for name, value in saved.items():
                setattr(mod, name, value)

    class _Patch(contextlib.ContextDecorator):
        def __enter__(self):
            self._cm = _ctx()
            return self._cm.__enter__()

        def __exit__(self, *exc):
            return self._cm.__exit__(*exc)

    return _Patch()


sys.modules[__name__].__class__ = _ConfigModule
_push("cache_size_limit", cache_size_limit)
del functools

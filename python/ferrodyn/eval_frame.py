"""The Python side of the frame hook: installing this thread's callback around a call.

Owns the compiled-function wrapper (`wrap_compiled`: a `_C.CompiledFunction`, which sets the
thread's callback, calls the original and restores it — nothing else per call) and `disable` (callback off around a call or a
`with` block). Does not own the callback (convert_frame.py) or the hook itself (Rust).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from ferrodyn import _C

_set_eval_frame = getattr(_C, "set_eval_frame", None)  # None only before the hook is built


def hook_callback(callback: Any) -> Any:
    """What the wrapper installs for `callback`: a callback with a non-zero `backend_id`
    attribute (a FrameCallback) is tied to its backend with `_C.BackendCallback`, so that its
    calls only run cache entries compiled for that backend (built once, per compile: the
    per-call cost stays one `set_eval_frame` each way). Anything else is installed as is."""
    backend_id = getattr(callback, "backend_id", 0)
    if callback is not None and backend_id and hasattr(_C, "BackendCallback"):
        return _C.BackendCallback(callback, backend_id)
    return callback


def wrap_compiled(fn: Callable[..., Any], callback: Any) -> Callable[..., Any]:
    """`fn` with `callback` installed as this thread's frame callback for the duration of each
    call: every frame started inside (fn's own and its callees') is seen by the hook, and only
    runs entries compiled for the callback's backend (see `hook_callback`). The wrapper is a
    native `_C.CompiledFunction` (no Python frame per call) carrying fn's name, docstring and
    `__wrapped__`; it binds as a method like a function."""
    wrapper = _C.CompiledFunction(fn, hook_callback(callback))
    try:
        functools.update_wrapper(wrapper, fn)
    except AttributeError:  # a callable without __name__ & co.: keep what it has
        pass
    wrapper._ferrodyn_compiled = True  # type: ignore[attr-defined]
    wrapper._ferrodyn_callback = callback  # type: ignore[attr-defined]
    return wrapper


class DisableContext:
    """`with ferrodyn.disable():` — no frame is intercepted inside the block on this thread.
    Also a decorator (`@ferrodyn.disable()`)."""

    def __init__(self) -> None:
        self._saved: list[Any] = []

    def __enter__(self) -> "DisableContext":
        self._saved.append(_set_eval_frame(None))
        return self

    def __exit__(self, *exc: Any) -> None:
        _set_eval_frame(self._saved.pop())

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return disable(fn)


def disable(fn: Callable[..., Any] | None = None, recursive: bool = True):
    """Run `fn` without graph capture (like `torch._dynamo.disable`).

    `disable(fn)` / `@disable`: a wrapper that turns this thread's callback off for the call, so
    neither fn nor anything it calls is traced (an nn.Module gives an OptimizedModule that does
    the same). `recursive=False`: only fn's own frames are
    skipped (its callees are still captured); fn is returned unchanged. `disable()` with no
    function: a context manager and decorator."""
    if fn is None:
        return DisableContext()
    if not callable(fn):
        raise TypeError(f"ferrodyn.disable expects a callable, got {type(fn).__name__}")
    import torch

    if isinstance(fn, torch.nn.Module) and recursive:
        from ferrodyn.optimized_module import OptimizedModule

        return OptimizedModule(fn, None)  # the wrapper installs "no callback" around each call
    if not recursive:
        code = getattr(inspect.unwrap(fn), "__code__", None)
        if code is None:
            code = getattr(getattr(fn, "forward", None), "__code__", None)
        if code is not None:
            _C.skip_code(code)
        return fn
    sef = _set_eval_frame

    @functools.wraps(fn)
    def ferrodyn_disabled(*args, **kwargs):
        prior = sef(None)
        try:
            return fn(*args, **kwargs)
        finally:
            sef(prior)

    ferrodyn_disabled._ferrodyn_disabled = True  # type: ignore[attr-defined]
    return ferrodyn_disabled

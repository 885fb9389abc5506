"""Cross-trace reuse of FakeTensorMode dispatch-cache entries for make_fx's symbolic traces.

Owns: `install(fake_mode)`, which gives one FakeTensorMode that make_fx created itself (fresh
ShapeEnv, symbolic tracing) a dispatch-cache lookup that also consults a per-process table of
entries recorded by earlier traces; the ShapeEnv-state fingerprint that keys that table; and
`clear()`.

Why: torch caches a fake op whose inputs carry symbolic sizes only on the op's ShapeEnv, since
its result depends on that ShapeEnv's state (symbol hints and ranges, replacements, guards,
axioms). Every make_fx trace has a new ShapeEnv, so each op misses again, and a miss runs the
fake kernel (often a Python decomposition full of SymInt arithmetic) and then validates a new
entry by synthesising its output a second time.

How it stays exact: an entry recorded in one trace is reused in another only when
- torch's own cache key is equal (the op, every tensor's metadata with its size/stride
  expressions and hints, scalar arguments, default dtype/device, inference mode, the ShapeEnv
  settings, whether a proxy mode traces, the fake mode's epoch);
- the ShapeEnv's whole state is equal (`fingerprint`: every field of the ShapeEnv but caches
  and debug records; guards and runtime asserts by expression), and so are the fake mode's
  flags and the hashes of the configs its kernels read (fx.experimental, dynamo, functorch);
- recording it left the ShapeEnv's state unchanged (an op that adds a guard, a replacement, a
  range, a symbol is never reused: only torch's own per-ShapeEnv cache may serve it again), and
  its outputs are tensors described by sizes/strides alone (no SymInt or other object from the
  recording trace's ShapeEnv is kept).
A fake kernel is a function of exactly those inputs, so the reused entry yields what running it
would; a hit is also stored in the trace's ShapeEnv cache, as a miss would have been, so later
lookups in the trace behave as in torch. Everything else runs torch's own code path.

Does not own: the fake mode's set-up (make_fx.py, symbolic_shapes.py) or op recording (mode.py).
"""

from __future__ import annotations

import collections
import functools

import torch
from torch._subclasses import _fake_tensor_utils as _ftu, fake_tensor as _ft

# ShapeEnv fields that are caches of other fields, debug records or logging: not state.
_NOT_STATE = frozenset({
    "log", "counter", "var_to_stack", "fx_node_cache", "graph", "validator", "events",
    "check_recorded_events", "should_record_events", "is_recording", "_prev_cache_key",
    "_version_counter", "_replacements_version_counter", "_symop_cache", "fake_tensor_cache",
    "var_to_range_sloc", "replacements_slocs", "specialization_stacks",
    "source_name_to_debug_name", "_expr_sym_node_id", "_equality_graph",
    "_unbacked_replacements", "foreign_unbacked_symbol_cache", "name_to_symbol",
    "_resimplify_floor_div_axioms",
})

_MAX_ENTRIES = 8192
_entries: dict = {}  # (context, state fingerprint, torch's stripped key) -> valid entry
_SIMPLE = (bool, int, float, str, type(None))


class _Unfreezable(Exception):
    pass


def _freeze(v):
    """A hashable value-equal copy of `v` (containers copied, so later mutation of `v` cannot
    change it). Raises _Unfreezable for a value with no value-based hash."""
    t = type(v)
    if t in _SIMPLE:
        return v
    if t is dict or t is collections.Counter or t is collections.OrderedDict or t is collections.defaultdict:
        return (t, tuple((_freeze(k), _freeze(x)) for k, x in v.items()))
    if t is list or t is tuple:
        return (t, tuple(_freeze(x) for x in v))
    if t is set or t is frozenset:
        return (t, frozenset(_freeze(x) for x in v))
    if t.__name__ == "OrderedSet":
        return (t, tuple(_freeze(x) for x in v))
    if t.__name__ == "ShapeGuard":  # the stack location is debug information
        return (t, v.expr, v.size_oblivious)
    if t.__name__ == "RuntimeAssert":
        return (t, v.expr, v.msg)
    if t.__hash__ is None:
        raise _Unfreezable(t)
    return v


def fingerprint(shape_env):
    """The ShapeEnv's state as one hashable value, or None when some field cannot be frozen."""
    try:
        return tuple(
            (k, _freeze(v)) for k, v in vars(shape_env).items() if k not in _NOT_STATE
        )
    except _Unfreezable:
        return None


def _context(fake_mode):
    try:
        flags = tuple(
            (k, v) for k, v in vars(fake_mode).items() if type(v) in _SIMPLE
        )
        import torch._dynamo.config as dynamo_config
        import torch._functorch.config as functorch_config
        import torch.fx.experimental._config as fx_config

        return (type(fake_mode), flags, fx_config.get_hash(), dynamo_config.get_hash(),
                functorch_config.get_hash())
    except Exception:  # a config module without get_hash: no reuse
        return None


def _reusable(entry) -> bool:
    """Only tensor outputs described by plain ints and stripped SymInt stubs: a constant output
    (an int, a SymInt of the recording trace's ShapeEnv) is never reused."""
    if not isinstance(entry, _ft._DispatchCacheValidEntry):
        return False
    for info in entry.output_infos:
        if info.inplace_idx is not None:
            continue
        md = info.metadata
        if md is None:
            return False
        for v in (*md.shape, *md.stride, md.storage_offset, md.storage_bytes):
            if v is not None and type(v) is not int and type(v) is not _ftu._SymIntOutputStub:
                return False
            if type(v) is _ftu._SymIntOutputStub and not isinstance(
                v.value, (int, _ftu._DeconstructedSymNode)
            ):
                return False
            if type(v) is _ftu._SymIntOutputStub and type(v.value) is not int and (
                v.value.fx_node is not None and v.value.fx_node is not False
            ):
                return False
    return True


_REQUIRED = (
    "_cache_key", "_dispatch_impl", "_make_cache_entry", "_output_from_cache_entry",
)


def available() -> bool:
    return all(hasattr(_ft.FakeTensorMode, n) for n in _REQUIRED) and all(
        hasattr(_ft, n) for n in (
            "_CacheKeyState", "_BypassDispatchCache", "_DispatchCacheBypassEntry",
            "_DispatchCacheValidEntry", "_set_cache_key_for_shape_env", "_set_cache_key",
        )
    ) and all(hasattr(_ftu, n) for n in ("_SymIntOutputStub", "_DeconstructedSymNode"))


def install(fake_mode) -> bool:
    """Route `fake_mode`'s cached dispatch through the cross-trace table. Returns False (and
    changes nothing) when the fake mode or torch does not allow it."""
    shape_env = fake_mode.shape_env
    if (
        shape_env is None
        or not available()
        or not fake_mode.cache_enabled
        or fake_mode.cache_crosscheck_enabled
        or getattr(shape_env, "_translation_validation_enabled", True)
    ):
        return False
    ctx = _context(fake_mode)
    if ctx is None:
        return False
    fake_mode._cached_dispatch_impl = functools.partial(_cached_dispatch_impl, fake_mode, ctx)
    return True


def clear() -> None:
    _entries.clear()


def _cached_dispatch_impl(mode, ctx, func, types, args, kwargs):
    """torch's FakeTensorMode._cached_dispatch_impl with the cross-trace table consulted
    between a miss in the ShapeEnv's cache and running the kernel."""
    FTM = _ft.FakeTensorMode
    state = key = None
    try:
        state = _ft._CacheKeyState(mode.shape_env)
        key = mode._cache_key(state, func, args, kwargs)
    except _ft._BypassDispatchCache as e:
        FTM.cache_bypasses[e.reason] += 1
    if key is None:
        return mode._dispatch_impl(func, types, args, kwargs)

    if not state.cache_on_shape_env():
        cache = FTM.cache
        set_cache_key = _ft._set_cache_key
        fp = None
    else:
        cache = state.shape_env.fake_tensor_cache
        set_cache_key = _ft._set_cache_key_for_shape_env
        fp = None
    entry = cache.get(key, None)
    if entry is not None:
        if isinstance(entry, _ft._DispatchCacheBypassEntry):
            FTM.cache_bypasses[entry.reason] += 1
            return mode._dispatch_impl(func, types, args, kwargs)
        output = mode._output_from_cache_entry(state, entry, key, args)
        FTM.cache_hits += 1
        return output

    xkey = None
    if (
        cache is not FTM.cache
        and state.shape_env is mode.shape_env
        and isinstance(func, torch._ops.OpOverload)
    ):
        fp = fingerprint(mode.shape_env)
    if fp is not None:
        xkey = (ctx, fp, key)
        entry = _entries.get(xkey)
        if entry is not None:
            output = mode._output_from_cache_entry(state, entry, key, args)
            FTM.cache_hits += 1
            set_cache_key(cache, key, entry)
            return output

    output = mode._dispatch_impl(func, types, args, kwargs)
    try:
        entry = mode._make_cache_entry(state, key, func, args, kwargs, output)
    except _ft._BypassDispatchCache as e:
        FTM.cache_bypasses[e.reason] += 1
        set_cache_key(cache, key, _ft._DispatchCacheBypassEntry(e.reason))
        return output
    set_cache_key(cache, key, entry)  # strips the key of its ShapeEnv
    FTM.cache_misses += 1
    if xkey is not None and _reusable(entry) and fingerprint(mode.shape_env) == fp:
        if len(_entries) >= _MAX_ENTRIES:
            _entries.clear()
        _entries[xkey] = entry
    return output

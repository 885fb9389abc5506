"""Deferred validation of FakeTensorMode dispatch-cache entries in make_fx's own ShapeEnv.

Owns: `install(fake_mode)`, which gives a FakeTensorMode that make_fx created itself (over a
fresh ShapeEnv) a cache-entry check that runs when an entry is first used instead of when it is
made, and `installed(fake_mode)`.

Why: on a cache miss, torch builds the entry for the op's output and, to check it, synthesises
a second FakeTensor from it (`empty_strided`, `set_` for a view, each computing the symbolic
size, contiguity and numel facts of the new tensor in Python SymNode arithmetic) only to compare
its dispatch key set with the real output's. An op whose inputs carry symbolic sizes is cached on
the trace's ShapeEnv, which dies with the trace, so most entries are never used again and that
synthesis is a third of a symbolic transformer trace.

How it stays exact: the entry is made exactly as torch makes it (the same metadata, the same
bypass checks on the output) except for the synthesis; what the synthesis compared (the real
output's dispatch key set) is recorded with the entry. The first lookup that finds the entry
synthesises the output anyway (torch's hit path) and compares then: equal, the entry is valid
from then on and the synthesised output is the result, as in torch; different, or the
synthesis needs a data-dependent guard (torch's "data dependent symnode"), the entry becomes the
bypass entry torch would have stored at the miss and the op runs as a bypass, as in torch. The
synthesis has no effect the trace can see (it runs with proxy tracing off and guards
suppressed; the ShapeEnv's symbolic-op memo holds expressions, never SymNodes), so skipping it
where the entry is never used leaves the graph, its values and the ShapeEnv as torch's.
Entries of the process-wide cache (ops with no symbolic input), which other fake modes read,
are checked at once as torch does.

Also owns a faster equivalent of the cache key's argument flattening
(`FakeTensorMode._prep_args_for_hash`), installed on the same fake modes: it appends exactly the
values torch appends, in the same order (a FakeTensor's `TensorMetadata` fields written out
directly instead of through a dataclass instance and `dataclasses.fields`), and hands every case
it does not write out itself (dicts, sparse or other non-strided tensors, functions, modules,
devices, any other type) to torch's own function. Installed only where `TensorMetadata` has the
fields it was written against.

Does not own: the fake mode's set-up (make_fx.py, symbolic_shapes.py) or op recording (mode.py).
"""

from __future__ import annotations

import dataclasses
import types

import torch
from torch import SymInt
from torch._subclasses import fake_tensor as _ft

_FTM = _ft.FakeTensorMode
_get_info = _FTM._get_output_info_for_cache_entry
_output_from_entry = _FTM._output_from_cache_entry
_cached_dispatch = _FTM._cached_dispatch_impl
_key_set = torch._C._dispatch_key_set
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default

_REQUIRED = (
    "_get_output_info_for_cache_entry", "_output_from_cache_entry", "_cached_dispatch_impl",
    "_dispatch_impl",
)


class _Invalid(Exception):
    """A deferred check failed at the first use of its entry (`reason`: torch's bypass reason)."""

    def __init__(self, key, reason: str):
        super().__init__(reason)
        self.key = key
        self.reason = reason


def _available() -> bool:
    return all(hasattr(_FTM, n) for n in _REQUIRED) and all(
        hasattr(_ft, n) for n in (
            "_DispatchCacheBypassEntry", "_DispatchCacheEntryOutputInfo",
            "_set_cache_key_for_shape_env", "extract_tensor_metadata",
        )
    )


def installed(fake_mode) -> bool:
    return "_cached_dispatch_impl" in vars(fake_mode)


def install(fake_mode) -> bool:
    """Defer the entry checks of `fake_mode`'s ShapeEnv cache. Returns False (and changes
    nothing) when torch's internals are not the ones this was written against, the mode has no
    ShapeEnv, or cache cross-checking (a debugging aid that compares every hit) is on."""
    if (
        fake_mode.shape_env is None
        or not fake_mode.cache_enabled
        or fake_mode.cache_crosscheck_enabled
        or not _available()
    ):
        return False
    pending: dict[int, tuple] = {}  # id(output info) -> (info, the real output's key set)
    fake_mode._get_output_info_for_cache_entry = types.MethodType(
        _deferring_get_info(pending), fake_mode
    )
    fake_mode._output_from_cache_entry = types.MethodType(_checking_output(pending), fake_mode)
    fake_mode._cached_dispatch_impl = types.MethodType(_cached_dispatch_impl, fake_mode)
    if _fast_key_available():
        fake_mode._prep_args_for_hash = types.MethodType(_prep_args_for_hash, fake_mode)
    return True


def _deferring_get_info(pending):
    def get_info(self, state, key, func, args, kwargs, output):
        if not (
            isinstance(output, _ft.FakeTensor)
            and state.cache_on_shape_env()
            and state.shape_env is self.shape_env
        ):
            return _get_info(self, state, key, func, args, kwargs, output)
        for a in args:
            if a is output:  # in-place: torch records the aliased argument, no synthesis
                return _get_info(self, state, key, func, args, kwargs, output)
        info = _info_without_synthesis(state, func, args, output)
        pending[id(info)] = (info, _key_set(output))
        return info

    return get_info


def _info_without_synthesis(state, func, args, output):
    """torch's output info for a FakeTensor result that is not an argument (its metadata, the
    argument it views), made the way torch makes it, without the synthesised output."""
    view_idx = None
    if isinstance(func, torch._ops.OpOverload) and (func.is_view or func is _UNSAFE_VIEW):
        idxs = [i for i, t in enumerate(args) if isinstance(t, torch.Tensor)]
        if len(idxs) != 1:
            raise AssertionError(f"Expected exactly one tensor arg for view op, got {len(idxs)}")
        view_idx = idxs[0]
    md = _ft.extract_tensor_metadata(output)
    convert = state.convert_output
    md.shape = tuple(convert(v) for v in md.shape)
    md.stride = tuple(convert(v) for v in md.stride)
    md.storage_offset = convert(md.storage_offset)
    md.storage_bytes = None if md.storage_bytes is None else convert(md.storage_bytes)
    return _ft._DispatchCacheEntryOutputInfo(inplace_idx=None, metadata=md, view_idx=view_idx)


def _checking_output(pending):
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    def output_from_entry(self, state, entry, key, args):
        infos = entry.output_infos
        checks = [pending.get(id(i)) for i in infos]
        if not any(checks):
            return _output_from_entry(self, state, entry, key, args)
        try:
            out = _output_from_entry(self, state, entry, key, args)
        except GuardOnDataDependentSymNode:
            raise _Invalid(key, "data dependent symnode") from None
        outs = out if entry.is_output_tuple else (out,)
        for o, check in zip(outs, checks):
            if check is not None and _key_set(o) != check[1]:
                raise _Invalid(key, "dispatch_key_set mismatch")
        for i, check in zip(infos, checks):
            if check is not None:
                del pending[id(i)]
        return out

    return output_from_entry


def _cached_dispatch_impl(self, func, types, args, kwargs):
    try:
        return _cached_dispatch(self, func, types, args, kwargs)
    except _Invalid as e:
        # what torch stores when the check fails at the miss, and what it then does on a hit
        _ft._set_cache_key_for_shape_env(
            self.shape_env.fake_tensor_cache, e.key, _ft._DispatchCacheBypassEntry(e.reason)
        )
        _FTM.cache_bypasses[e.reason] += 1
        return self._dispatch_impl(func, types, args, kwargs)


# -- the cache key's argument flattening ----------------------------------------------------

_prep_args = _FTM._prep_args_for_hash
_METADATA_FIELDS = (
    "dtype", "shape", "stride", "device", "layout", "memory_format", "storage_offset",
    "storage_bytes", "requires_grad", "is_quantized", "is_conj", "is_neg", "is_inference",
    "is_sparse", "is_coalesced", "dense_dim", "sparse_dim",
)
# leaves torch's flattening appends as (type, value): none of them is a type it tests for first
_PLAIN = frozenset({int, float, bool, str, complex, type(None), torch.dtype, torch.layout,
                    torch.memory_format})
_STRIDED = torch.strided
_FakeTensor = _ft.FakeTensor


def _fast_key_available() -> bool:
    try:
        fields = tuple(f.name for f in dataclasses.fields(_ft.TensorMetadata))
    except TypeError:
        return False
    return fields == _METADATA_FIELDS and hasattr(_ft, "suggest_memory_format")


def _prep_args_for_hash(self, result, args, state, id_hashed_objects):
    """torch's `_prep_args_for_hash` (same appends, same order, same bypasses), with plain
    leaves, SymInts, lists/tuples and strided FakeTensors written out here."""
    ta = type(args)
    if ta is dict or not isinstance(args, (list, tuple)):
        return _prep_args(self, result, args, state, id_hashed_objects)
    append = result.append
    append(ta)
    append(f"length_{len(args)}")
    for arg in args:
        t = type(arg)
        if t in _PLAIN:
            append(t)
            append(arg)
        elif t is SymInt:
            state.convert_sym_int(result, arg)
        elif t is _FakeTensor and arg.layout is _STRIDED and not arg.is_mkldnn:
            _flatten_fake(self, result, arg, state)
        elif t is list or t is tuple:
            _prep_args_for_hash(self, result, arg, state, id_hashed_objects)
        else:  # torch's code for this one argument (an iterator: no container header)
            _prep_args(self, result, iter((arg,)), state, id_hashed_objects)


def _flatten_sizes(result, values, state) -> None:
    result.append(type(values))
    result.append(f"length_{len(values)}")
    for v in values:
        if type(v) is SymInt:
            state.convert_sym_int(result, v)
        elif type(v) in _PLAIN:
            result.append(type(v))
            result.append(v)
        else:  # pragma: no cover - sizes and strides hold ints and SymInts
            raise AssertionError(f"unexpected size {v!r}")


def _flatten_fake(mode, result, t, state) -> None:
    """What torch appends for a strided FakeTensor argument: its checks, then
    `extract_tensor_metadata(t)._flatten_into(result, mode, state)` written out field by field
    (a tuple field flattened as a container, a SymInt converted, any other value appended)."""
    if t.fake_mode is not mode:
        raise _ft._BypassDispatchCache("not our fake")
    if t.constant is not None:
        raise _ft._BypassDispatchCache("constant attribute")
    append = result.append
    append(t.dtype)
    _flatten_sizes(result, t.shape, state)
    _flatten_sizes(result, t.stride(), state)
    append(t.device)
    append(_STRIDED)
    if t._has_symbolic_sizes_strides:
        append(None)
    else:
        fmt = _ft.suggest_memory_format(t)
        append(fmt if t.is_contiguous(memory_format=fmt) else None)
    for v in (t.storage_offset(), t.untyped_storage().nbytes()):
        if type(v) is SymInt:
            state.convert_sym_int(result, v)
        else:
            append(v)
    append(t.requires_grad)
    append(t.is_quantized)
    append(t.is_conj())
    append(t.is_neg())
    append(t.is_inference())
    append(t.is_sparse)
    append(None)
    append(None)
    append(None)

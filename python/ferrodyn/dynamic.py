"""Dynamic-shape policy: which tensor dims and which Python ints a capture makes symbolic.

Owns the three `compile(dynamic=...)` policies (None: automatic dynamic; True: dynamic from
the first compile; False: static), the per-code-object memory of automatic dynamic (the sizes
and ints seen by the last compile of a code object; a recompile that sees another value at a
dim marks that dim dynamic for that code object from then on), the user marks
(`torch._dynamo.mark_dynamic` / `maybe_mark_dynamic` / `mark_static` set attributes on the
tensor; `ferrodyn.mark_dynamic` & co. set the same ones) and the `dynamic` log.
Does not own making symbolic fakes or shape guards (symbolic_shapes.py) or the trackers.

    convert_frame ── with policy_for(code, dynamic): trace ──► OutputGraph reads `current()`
                  └─ after a successful compile: `commit()` remembers what was seen
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ferrodyn.logs import dynamic_log
from ferrodyn.source import AttrSource, DictOfSource, GlobalSource, LocalSource, Source

# A tensor seen at a source: its sizes, None where a dim is already dynamic.
_Sizes = tuple


@dataclass
class FrameDynamism:
    """What automatic dynamic remembers for one code object, by source name."""

    sizes: dict[str, list[int | None]] = field(default_factory=dict)
    ints: dict[str, int | None] = field(default_factory=dict)


# id(code) -> (weakref to code, FrameDynamism); cleared by ferrodyn.reset()
_frames: dict[int, tuple[Any, FrameDynamism]] = {}
_local = threading.local()


def reset_state() -> None:
    _frames.clear()


def _memory(code) -> FrameDynamism:
    key = id(code)
    item = _frames.get(key)
    if item is None or item[0]() is not code:
        ref = weakref.ref(code, lambda _r, k=key: _frames.pop(k, None))
        item = _frames[key] = (ref, FrameDynamism())
    return item[1]


def _loop_item(source: Source) -> bool:
    """An item of a for loop's iterator handed to a resume function (resume.LoopRest): the
    loop's next value, an int like a local (automatic dynamic: a loop counter does not make
    one resume entry per iteration), or an item of one (`enumerate`'s count, resume/loops.py)."""
    from ferrodyn.source import ItemSource
    if isinstance(source, ItemSource) and isinstance(source.base, ItemSource):
        source = source.base
    return isinstance(source, ItemSource) and isinstance(source.base, LocalSource) and \
        source.base.name().startswith("L['__ferrodyn_stack")


def _cell_int(source: Source) -> bool:
    """The contents of a closure cell (`nonlocal` counters, the cells a resume function is
    handed): an int like a local, so a counter kept in a cell does not compile once per value."""
    from ferrodyn.source import ClosureSource
    return isinstance(source, ClosureSource) or \
        isinstance(source, AttrSource) and source.attr == "cell_contents"


class Policy:
    """The policy of one trace: `dims_for(source, tensor)` and `int_is_dynamic(source, value)`
    answer the converter; what they saw is remembered by `commit()`."""

    def __init__(self, code, mode: bool | None):
        self.code = code
        self.mode = mode  # None automatic, True all dynamic, False static
        self.memory = _memory(code) if code is not None else FrameDynamism()
        self._seen_sizes: dict[str, list[int | None]] = {}
        self._seen_ints: dict[str, int | None] = {}
        self.symbolic = False  # whether this trace made anything symbolic

    # -- tensors ---------------------------------------------------------------------------
    def dims_for(self, source: Source, value: torch.Tensor) -> tuple[set[int], set[int], set[int]]:
        """(dynamic dims, strict dims, duck-sized dims) of the tensor input at `source`.
        Strict dims were `mark_dynamic`ed: specialising one is an error. Under dynamic=True
        dims are duck-sized (equal sizes share a symbol) until their size changed, as torch."""
        n = value.dim()
        strict = {d % n for d in getattr(value, "_dynamo_dynamic_indices", ()) if n}
        weak = {d % n for d in getattr(value, "_dynamo_weak_dynamic_indices", ()) if n}
        static = {d % n for d in getattr(value, "_dynamo_static_indices", ()) if n}
        name = source.name()
        sizes = list(value.shape)
        if not _may_be_dynamic(source) or isinstance(value, torch.nn.Parameter) or \
                self.mode is False:
            if self.mode is not False and _may_be_dynamic(source):
                self._seen_sizes[name] = sizes
            self.symbolic |= bool(strict)
            return strict, strict, set()
        dyn = set(strict | weak)
        changed: set[int] = set()
        before = self.memory.sizes.get(name)
        if before is not None and len(before) == n:
            changed = {i for i in range(n) if before[i] is None or before[i] != sizes[i]}
            if self.mode is None:
                for i in sorted(changed - {i for i in range(n) if before[i] is None}):
                    dynamic_log.debug("automatic dynamic: %s size %d changed %s -> %s, dim %d "
                                      "is dynamic from now on", name, i, before[i], sizes[i], i)
        duck: set[int] = set()
        if self.mode is True:
            dyn |= set(range(n))
            duck = set(range(n)) - changed - strict - weak
        elif self.mode is None:
            dyn |= changed
        dyn -= static - strict
        self._seen_sizes[name] = [None if i in changed else s for i, s in enumerate(sizes)]
        self.symbolic |= bool(dyn)
        return dyn, strict, duck

    # -- ints ----------------------------------------------------------------------------
    def int_is_dynamic(self, source: Source, value: int) -> bool:
        if not (isinstance(source, LocalSource) or _loop_item(source) or _cell_int(source) or
                _object_attr(source)) or self.mode is False:
            return False
        name = source.name()
        if self.mode is True:
            self._seen_ints[name] = None
            self.symbolic = True
            return True
        before = self.memory.ints.get(name, value)
        if before is None or before != value:
            if before is not None:
                dynamic_log.debug("automatic dynamic: %s changed %s -> %s, it is a SymInt from "
                                  "now on", name, before, value)
            self._seen_ints[name] = None
            self.symbolic = True
            return True
        self._seen_ints[name] = value
        return False

    def commit(self) -> None:
        """Remember what this (successful) trace saw, for the next recompile of the code."""
        for name, sizes in self._seen_sizes.items():
            old = self.memory.sizes.get(name)
            if old is not None and len(old) == len(sizes):
                sizes = [None if o is None else s for o, s in zip(old, sizes)]
            self.memory.sizes[name] = sizes
        for name, v in self._seen_ints.items():
            if self.memory.ints.get(name, 0) is not None or name not in self.memory.ints:
                self.memory.ints[name] = v


def _object_attr(source: Source) -> bool:
    """An attribute of an object passed in (not `self`'s, not module state: `_may_be_dynamic`),
    such as a cache layer's `cumulative_length_int`: an int like a local, so a counter kept on
    the object does not compile once per value."""
    s, attrs = source, False
    while s is not None:
        attrs |= isinstance(s, (AttrSource, DictOfSource))
        s = getattr(s, "base", None)
    return attrs and _may_be_dynamic(source)


_MODULE_STATE = frozenset({"_parameters", "_buffers", "_modules"})


def _may_be_dynamic(source: Source) -> bool:
    """Frame values reached from an argument other than `self` (`L['x']`, `L['xs'][0]`, the
    attributes of an object passed in: `L['cache'].layers[0].keys`, a KV cache whose length
    grows each decode step): module state (`self`'s attributes, anything read through
    `_parameters`/`_buffers`/`_modules`) and globals keep static shapes, as torch.compile keeps
    parameters, buffers and module properties."""
    s = source
    attrs = False
    while True:
        if isinstance(s, GlobalSource) or getattr(s, "static_shapes", False):
            return False  # (numpy_vars.NumpyTensorSource: static_shapes)
        if isinstance(s, (AttrSource, DictOfSource)):
            attrs = True
        if isinstance(s, AttrSource) and s.attr in _MODULE_STATE or \
                getattr(s, "key", None) in _MODULE_STATE and isinstance(s.base, DictOfSource):
            return False
        base = getattr(s, "base", None)
        if base is None:
            return isinstance(s, LocalSource) and not (attrs and s.name() == "L['self']")
        s = base


_STATIC = Policy(None, False)


def current() -> Policy:
    """The policy of the trace running on this thread (static outside `policy_for`)."""
    return getattr(_local, "policy", None) or _STATIC


@contextlib.contextmanager
def policy_for(code, mode: bool | None) -> Iterator[Policy]:
    prior = getattr(_local, "policy", None)
    policy = _local.policy = Policy(code, mode)
    try:
        yield policy
    finally:
        _local.policy = prior


# ---- ferrodyn's marks: the same attributes torch._dynamo's marks set -----------------------

def _dims(t: torch.Tensor, index) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    idx = list(range(t.dim())) if index is None else \
        list(index) if isinstance(index, (list, tuple)) else [index]
    for i in idx:
        if not isinstance(i, int) or not -t.dim() <= i < max(t.dim(), 1):
            raise ValueError(f"dim {i!r} out of range for a {t.dim()}-d tensor")
    return [i % t.dim() for i in idx]


def _add(t: torch.Tensor, attr: str, dims) -> None:
    if not hasattr(t, attr):
        setattr(t, attr, set())
    getattr(t, attr).update(dims)


def mark_dynamic(t: torch.Tensor, index) -> None:
    """Dim(s) `index` of `t` are symbolic from the first compile; specialising one (the code
    needs a concrete size) is an error naming the cause. Same as torch._dynamo.mark_dynamic."""
    _add(t, "_dynamo_dynamic_indices", _dims(t, index))


def maybe_mark_dynamic(t: torch.Tensor, index) -> None:
    """Like mark_dynamic, but specialising the dim is allowed."""
    _add(t, "_dynamo_weak_dynamic_indices", _dims(t, index))


def mark_static(t: torch.Tensor, index=None) -> None:
    """Dim(s) `index` (all when None) of `t` keep static sizes even under dynamic=True."""
    _add(t, "_dynamo_static_indices", _dims(t, index))


def log_enabled() -> bool:
    return dynamic_log.isEnabledFor(logging.DEBUG)

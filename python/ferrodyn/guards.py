"""Compile guard specifications (guard_spec.GuardSpec) into a Rust `_C.GuardTree`.

Owns the mapping Source -> GuardBuilder accessor and GuardKind -> GuardBuilder leaf, both as
dispatch tables. Does not decide what to guard (the converter does) and never evaluates a guard
(Rust does, on every call).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ferrodyn import _C
from ferrodyn.guard_spec import GuardKind, GuardSpec
from ferrodyn.source import (
    AttrSource,
    BuiltinSource,
    ClosureSource,
    DictItemSource,
    DictOfSource,
    DictValueSource,
    GlobalSource,
    ItemSource,
    LenSource,
    LocalSource,
    SetItemSource,
    Source,
    TypeSource,
)


class GuardCompileError(TypeError):
    """A spec that cannot be expressed as a Rust guard (an unknown Source or kind)."""


# Source class -> how to make its accessor: (builder, source, node_of) -> GuardNode
_ACCESSORS: dict[type, Callable[[Any, Any, Callable[[Source], Any]], Any]] = {
    LocalSource: lambda b, s, node: b.local(s.index, s.local_name),
    GlobalSource: lambda b, s, node: b.global_(s.global_name),
    BuiltinSource: lambda b, s, node: b.builtin(s.builtin_name),
    ClosureSource: lambda b, s, node: b.closure_cell(s.index, s.cell_name),
    AttrSource: lambda b, s, node: b.attr(node(s.base), s.attr),
    ItemSource: lambda b, s, node: b.item(node(s.base), s.key),
    DictOfSource: lambda b, s, node: b.dict_of(node(s.base)),
    TypeSource: lambda b, s, node: b.type_of(node(s.base)),
    LenSource: lambda b, s, node: b.len_of(node(s.base)),
    SetItemSource: lambda b, s, node: b.set_item(node(s.base), s.index),
    DictValueSource: lambda b, s, node: b.dict_value(node(s.base), s.index),
    DictItemSource: lambda b, s, node: b.dict_item(node(s.base), s.key),
}

# GuardKind -> how to add its leaf: (builder, node, spec) -> None
_LEAVES: dict[GuardKind, Callable[[Any, Any, GuardSpec], None]] = {
    GuardKind.TYPE_MATCH: lambda b, n, g: b.type_is(n, g.payload),
    GuardKind.ID_MATCH: lambda b, n, g: b.is_(n, g.payload),
    GuardKind.NONE: lambda b, n, g: b.is_none(n),
    GuardKind.NOT_NONE: lambda b, n, g: b.is_not_none(n),
    GuardKind.EQUALS: lambda b, n, g: b.equals(n, g.payload),
    GuardKind.LENGTH: lambda b, n, g: b.length_is(n, g.payload),
    GuardKind.DICT_KEYS: lambda b, n, g: b.dict_keys(n, list(g.payload)),
    GuardKind.DICT_LACKS: lambda b, n, g: b.dict_lacks(n, g.payload),
    GuardKind.DICTS_EMPTY: lambda b, n, g: b.dicts_empty(n, list(g.payload)),
    GuardKind.TENSOR_MATCH: lambda b, n, g: b.tensor_match(n, g.payload, dynamic_dims=g.dynamic_dims),
}


def has_accessor(source: Source) -> bool:
    """Whether a guard tree can read `source` (so it can also hand its value over: exports)."""
    if _accessor_for(type(source)) is None:
        return False
    base = getattr(source, "base", None)
    return base is None or has_accessor(base)


def _accessor_for(cls: type):
    for klass in cls.__mro__:
        if klass in _ACCESSORS:
            return _ACCESSORS[klass]
    return None


def compile_guards(specs: Iterable[GuardSpec], f_globals: dict | None = None,
                   f_builtins: dict | None = None, *, builder_factory: Callable[..., Any] | None = None,
                   exports: Iterable[Source] = ()):
    """Build one GuardTree from `specs` (duplicates dropped, order kept; the tree orders its
    leaves cheap-first itself). `builder_factory` defaults to `_C.GuardBuilder`. `exports`:
    sources whose values a passing check hands to the entry function, in this order, after
    its argument slots and closure cells (`GuardBuilder.export`)."""
    builder = (builder_factory or _C.GuardBuilder)(f_globals, f_builtins)
    nodes: dict[Source, Any] = {}
    # Sources are nested frozen dataclasses whose hash walks the whole chain: look the same
    # object up by identity first (the specs list keeps every source alive meanwhile).
    by_id: dict[int, Any] = {}

    def node_of(src: Source):
        found = by_id.get(id(src))
        if found is not None:
            return found
        found = nodes.get(src)
        if found is None:
            make = _accessor_for(type(src))
            if make is None:
                raise GuardCompileError(f"no guard accessor for source {type(src).__name__} ({src.name()})")
            found = nodes[src] = make(builder, src, node_of)
        by_id[id(src)] = found
        return found

    specs = list(specs)  # keeps the sources alive for `by_id`
    seen: set[GuardSpec] = set()
    for spec in specs:
        if spec in seen:
            continue
        seen.add(spec)
        if spec.kind is GuardKind.GLOBAL_STATE:
            builder.global_state()
            continue
        if spec.kind is GuardKind.NO_HANDLED_EXCEPTION:
            builder.no_handled_exception()
            continue
        if spec.kind is GuardKind.ALIASING:
            sources, groups, storages = spec.payload
            builder.aliasing([node_of(s) for s in sources], list(groups), list(storages))
            continue
        if spec.kind is GuardKind.SHAPE:  # symbols bound to several sources
            tokens, bindings = spec.payload
            builder.shape_guard(tokens, [(node_of(src), kind, dim) for src, kind, dim in bindings])
            continue
        leaf = _LEAVES.get(spec.kind)
        if leaf is None:
            raise GuardCompileError(f"no guard leaf for kind {spec.kind!r}")
        if spec.source is None:
            raise GuardCompileError(f"{spec.kind.name} guard without a source")
        node = node_of(spec.source)
        try:
            leaf(builder, node, spec)
        except TypeError as e:  # a payload the leaf cannot hold (e.g. EQUALS on an object)
            raise GuardCompileError(f"{spec.describe()}: {e}") from e
    exports = list(exports)
    for src in exports:
        builder.export(node_of(src))
    return builder.build()

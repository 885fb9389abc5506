"""SideEffects: every mutable Python object a trace touches, keyed by object identity, and the
mutations of objects that outlive the frame, replayed by the entry after the graph call.

Owns:
- `MutationType`: NEW (made while tracing: mutate freely, rebuilt from its final state when it
  escapes) or EXISTING (reached from the frame: mutations are recorded and replayed).
- The identity table: the builder asks `tracked(value)` before building a tracker for a mutable
  value (list, dict, set, user object, module, tensor) and `track(value, source, tracker)`
  after, so one Python object reached through two Sources (`f(xs, xs)`, `self.cache` and a
  local alias) is one tracker with one state. Every Source that reached a tracked object is
  remembered for the aliasing guard (`aliasing_guard_payload`).
- The mutation log, in program order: existing containers (first mutation; replayed from their
  final state: lists `old[:] = new`, dicts `clear(); update(new)`, sets by their operations in
  order), attribute stores/deletions on existing objects, global stores/deletions, stores into
  existing closure cells. Later reads in the same trace see pending values (`pending_attr`,
  `pending_global`).
- `replay(tx, before)`: the Out nodes that apply everything recorded so far. Every value the
  effects need (and the Outs in `before`, e.g. the frame's return value or a graph break's
  stack) is materialised first (`OutShared`), then the effects run in order, so a replay never
  reads state that an earlier effect of the same replay has changed. A graph break can flush
  the same table before an eager region.
Does not own: what a tracker's mutation means (the trackers call `mark_mutated` etc.),
building Out nodes of values (each tracker's `reconstruct`), rendering (codegen.py).
"""

from __future__ import annotations

import dataclasses
import enum
import gc
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ferrodyn.exc import BreakReason
from ferrodyn.trace_result import Out, OutCall, OutConst, OutShared, OutSource, OutTuple

if TYPE_CHECKING:  # pragma: no cover
    from ferrodyn.source import Source
    from ferrodyn.variables.base import VariableTracker


class MutationType(enum.Enum):
    NEW = "new"            # created while tracing
    EXISTING = "existing"  # reached from the frame; outlives it


DELETED = object()  # a pending attribute/global deletion


# ---- replay helpers (called by generated entries; plain functions, no tracing) ---------------

def replace_list(target: list, items: list) -> None:
    target[:] = items


def replace_dict(target: dict, keys: tuple, values: tuple) -> None:
    target.clear()
    target.update(zip(keys, values))


def apply_set_ops(target: set, ops: tuple) -> None:
    """Replay `(method name, args)` set operations in program order (iteration order of a set
    depends on its history, so the history is replayed, not the final contents)."""
    for name, args in ops:
        getattr(set, name)(target, *args)


def store_attr(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def delete_attr(obj: Any, name: str) -> None:
    object.__delattr__(obj, name)


def store_class_attr(cls: type, name: str, value: Any) -> None:
    """(objmodel) `Cls.name = value` replayed: the metaclass is `type`'s (checked when traced)."""
    type.__setattr__(cls, name, value)


def store_global(g: dict, name: str, value: Any) -> None:
    g[name] = value


def delete_global(g: dict, name: str) -> None:
    del g[name]


def store_cell(cell: Any, value: Any) -> None:
    cell.cell_contents = value


def _global_hook_dict_ids() -> set[int]:
    import torch.nn.modules.module as mm
    return {id(v) for k, v in vars(mm).items() if k.startswith("_global") and isinstance(v, dict)}


class SideEffects:
    """The identity table and mutation log of one capture (held by the OutputGraph)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, "VariableTracker"]] = {}
        self._reached: list[tuple["Source", Any]] = []   # (source, object) for aliasing guards
        self._log: list[tuple] = []                       # program order
        self._mutated_states: set[int] = set()
        self._attrs: dict[tuple[int, str], Any] = {}      # pending attribute values
        self._written_dicts: dict[int, dict] = {}         # __dict__ of objects with pending attrs
        self._internal: dict[int, Any] = {}               # nn.Module internal containers
        self._mutated_objs: dict[int, Any] = {}           # EXISTING containers mutated
        self._globals: dict[tuple[int, str], Any] = {}    # pending global values
        self._shared: dict[int, tuple[Any, OutShared]] = {}  # id(state) -> (state, out)
        self._next_key = 0
        self._building: set[Any] = set()
        self._deferred_fills: dict[int, list[Out]] = {}  # id(key being built) -> cells to fill
        self._class_attrs: dict[tuple[int, str], tuple[type, Any]] = {}  # pending class attrs
        self.dict_parts: dict[int, tuple[Any, Any]] = {}  # dict subclass object -> its items' tracker
        self.identity_sensitive = False  # set by mutations of objects and `is` on inputs
        self.tensor_sensitive = False    # set when the graph writes to an input in place
        # run before every replay (end of trace, graph break): raise Unsupported when a state
        # the replay cannot express is left (a generator suspended inside try/with)
        self.checks: list[Callable[[], None]] = []

    # -- speculation (a higher-order op's body traced into a child graph) ------------------
    def mark(self) -> tuple[dict, int]:
        """What a speculation restores afterwards: the identity table and the log's length."""
        return dict(self._by_id), len(self._log)

    def logged_since(self, mark: tuple[dict, int]) -> bool:
        return len(self._log) != mark[1]

    def restore_identity(self, mark: tuple[dict, int]) -> None:
        """Forget trackers built since `mark` (they hold the child graph's nodes)."""
        self._by_id.clear()
        self._by_id.update(mark[0])

    def held_values(self) -> list:
        """Trackers of reached objects and every pending value (attributes, globals, class
        attributes): what a speculated body must leave unchanged."""
        return [*(var for _, var in self._by_id.values()), *self._attrs.values(),
                *self._globals.values(), *(v for _, v in self._class_attrs.values())]

    # -- identity table --------------------------------------------------------------------
    def tracked(self, value: Any, source: "Source | None") -> "VariableTracker | None":
        hit = self._by_id.get(id(value))
        if hit is None or hit[0] is not value:
            return None
        if source is not None:
            self._reached.append((source, value))
        return hit[1]

    def tracked_object(self, var: "VariableTracker") -> tuple[Any] | None:
        """`(obj,)` when `var` is the tracker of object `obj` in the identity table, else None
        (the reverse of `tracked`)."""
        for obj, v in self._by_id.values():
            if v is var:
                return (obj,)
        return None

    def track(self, value: Any, source: "Source | None", var: "VariableTracker") -> "VariableTracker":
        import torch
        if isinstance(value, torch.nn.Module):
            self._note_module_internals(value)
        self._by_id[id(value)] = (value, var)
        if source is not None:
            self._reached.append((source, value))
        return var

    def aliasing_guard_payload(self) -> tuple | None:
        """(sources, identity groups, storage groups) for the aliasing guard, or None.

        Which Sources it covers: those of objects reached through two Sources (the trace made
        them one tracker); every tensor when the graph writes to an input in place
        (`tensor_sensitive`: aliasing changes what the graph computes); everything when a
        Python object was mutated or `is` looked at an input (`identity_sensitive`)."""
        import torch
        entries, seen_sources, count = [], set(), {}
        for source, obj in self._reached:
            if source not in seen_sources:
                seen_sources.add(source)
                entries.append((source, obj))
                count[id(obj)] = count.get(id(obj), 0) + 1

        def wanted(obj):
            if self.identity_sensitive or count[id(obj)] > 1:
                return True
            return self.tensor_sensitive and isinstance(obj, torch.Tensor)
        entries = [(s, o) for s, o in entries if wanted(o)]
        if len(entries) < 2:
            return None
        groups: dict[int, int] = {}
        storages: dict[int, int] = {}
        srcs, gids, sids = [], [], []
        for source, obj in entries:
            sid = None
            if isinstance(obj, torch.Tensor):
                try:
                    key = obj.untyped_storage()._cdata
                    sid = (storages.setdefault(key, len(storages)), int(obj.storage_offset()))
                except Exception:
                    from ferrodyn.variables.base import unsupported
                    unsupported(f"tensor {source.name()} without a readable storage",
                                BreakReason.UNSUPPORTED_TYPE)
            srcs.append(source)
            gids.append(groups.setdefault(id(obj), len(groups)))
            sids.append(sid)
        return tuple(srcs), tuple(gids), tuple(sids)

    # -- containers read behind the trackers' back -------------------------------------------
    def _note_module_internals(self, m: Any) -> None:
        """nn.Module calls read the hook dicts directly: mutating them through a dict tracker
        would not be seen, so it is refused (in either order). `_parameters`, `_buffers` and
        `_modules` are the exception: every reader of them asks for their dict tracker first
        (nn_module_state.module_dict), so their mutations are recorded and replayed."""
        from ferrodyn.variables.base import unsupported
        from ferrodyn.variables.nn_module_state import MODELLED_MODULE_DICTS
        for k, v in vars(m).items():
            if k in MODELLED_MODULE_DICTS and type(v) in (dict, OrderedDict):
                continue
            if k.startswith("_") and isinstance(v, (dict, list)):
                if id(v) in self._mutated_objs:
                    unsupported(f"module {type(m).__name__}.{k} mutated as a container",
                                BreakReason.SIDE_EFFECT)
                self._internal[id(v)] = v

    def _check_not_internal(self, obj: Any) -> None:
        from ferrodyn.variables.base import unsupported
        if obj is None:
            return
        if self._internal.get(id(obj)) is obj or id(obj) in _global_hook_dict_ids():
            unsupported("mutation of an nn.Module's internal dict (parameters, buffers, "
                        "submodules or hooks) as a container", BreakReason.SIDE_EFFECT)
        self._mutated_objs[id(obj)] = obj

    # -- mutations ---------------------------------------------------------------------------
    def mark_mutated(self, state: Any, make_effect: Callable[[Any], Out]) -> None:
        """An EXISTING container's first mutation: its final state is replayed by
        `make_effect(tx)` at its place in program order."""
        self._check_not_internal(getattr(state, "obj", None))
        self.identity_sensitive = True
        if id(state) not in self._mutated_states:
            self._mutated_states.add(id(state))
            self._log.append(("state", state, make_effect))

    def was_mutated(self, state: Any) -> bool:
        """Whether this trace mutated the EXISTING container of `state` (it is replayed)."""
        return id(state) in self._mutated_states

    def store_attr(self, obj: Any, obj_out: Callable[[Any], Out], name: str,
                   value: "VariableTracker | object") -> None:
        from ferrodyn.variables.base import unsupported
        d = getattr(obj, "__dict__", None)
        if self.tracked(d, None) is not None:
            unsupported(f"attribute {name!r} assigned after the object's __dict__ was used as a "
                        f"dict (two views of one dict are not modelled)", BreakReason.SIDE_EFFECT)
        self._written_dicts[id(d)] = d
        self.identity_sensitive = True
        self._attrs[(id(obj), name)] = value
        self._log.append(("attr", obj_out, name, value))

    def is_written_instance_dict(self, d: Any) -> bool:
        """Whether `d` is the `__dict__` of an object whose attributes this trace assigned (it
        must not also become a dict tracker: its pending items live in this table)."""
        return self._written_dicts.get(id(d)) is d

    def mutated_mapping(self, mapping: Any) -> bool:
        """Whether this trace changed `mapping` (the dict behind a mappingproxy): as a dict
        reached from the frame, as an object's `__dict__` through attribute stores, or as a
        class namespace through class-attribute stores."""
        if self._mutated_objs.get(id(mapping)) is mapping or self.is_written_instance_dict(mapping):
            return True
        return any(any(r is mapping for r in gc.get_referents(cls.__dict__))
                   for cls, _ in self._class_attrs.values())

    def pending_attr(self, obj: Any, name: str) -> Any:
        """The tracker stored this trace, DELETED, or None (nothing pending)."""
        return self._attrs.get((id(obj), name))

    # -- class attributes (objmodel): `Cls.x = v`, replayed with type.__setattr__ -------------
    def store_class_attr(self, cls: type, cls_var: "VariableTracker", name: str,
                         value: "VariableTracker") -> None:
        """Record `cls.name = value` (program order, flushed with the rest of the log); reads
        later in the trace see it through `pending_class_attr`."""
        from ferrodyn.variables.constant import ConstantVariable
        self.identity_sensitive = True
        self._class_attrs[(id(cls), name)] = (cls, value)
        self._log.append(("call", store_class_attr, (cls_var, ConstantVariable(value=name), value),
                          ()))

    def pending_class_attr(self, cls: type, name: str) -> Any:
        """The tracker stored into `cls.__dict__[name]` by this trace, or None."""
        hit = self._class_attrs.get((id(cls), name))
        return hit[1] if hit is not None and hit[0] is cls else None

    def store_global(self, g: dict, name: str, value: "VariableTracker | object") -> None:
        self.identity_sensitive = True
        self._globals[(id(g), name)] = value
        self._log.append(("global", g, name, value))

    def pending_global(self, g: dict, name: str) -> Any:
        return self._globals.get((id(g), name))

    def store_cell(self, cell_out: Out, value: "VariableTracker") -> None:
        self.identity_sensitive = True
        self._log.append(("cell", cell_out, value))

    def record_call(self, fn: Any, args: tuple, kwnames: tuple[str, ...] = ()) -> None:
        """A call made for its effect only (logging, warnings): replayed after the graph, in
        program order with the mutations; `args` are trackers, the last `len(kwnames)` of
        them passed by keyword."""
        self._log.append(("call", fn, tuple(args), tuple(kwnames)))

    @property
    def has_effects(self) -> bool:
        return bool(self._log)

    # -- rebuilding values -------------------------------------------------------------------
    def shared(self, key: Any, build: Callable[[], Out]) -> OutShared:
        """The Out of a NEW mutable object, built once per entry call however often it is
        reached (`return xs, xs`, an object stored in two places)."""
        hit = self._shared.get(id(key))
        if hit is not None and hit[0] is key:
            return hit[1]
        if id(key) in self._building:
            from ferrodyn.variables.base import unsupported
            unsupported("rebuilding a container that contains itself", BreakReason.UNSUPPORTED_TYPE)
        self._building.add(id(key))
        try:
            value = build()
        finally:
            self._building.discard(id(key))
        fills = self._deferred_fills.pop(id(key), None)
        if fills:  # cells whose contents are this object (a function closing over itself)
            value = OutCall(fill_cells, (value, OutTuple(tuple(fills))))
        out = self._new_shared(value)
        self._shared[id(key)] = (key, out)
        return out

    def is_building(self, key: Any) -> bool:
        """Whether the Out of `key` (a `shared` key) is being built (a reference to it now
        would be a cycle)."""
        return id(key) in self._building

    def defer_fill(self, key: Any, cell_out: Out) -> None:
        """Fill the cell `cell_out` with the object of `key` (being built) once it is made:
        `cell.cell_contents = obj` right after the object's own construction."""
        self._deferred_fills.setdefault(id(key), []).append(cell_out)

    def _new_shared(self, out: Out) -> OutShared:
        self._next_key += 1
        return OutShared(self._next_key, out)

    def _prefetch(self, out: Out) -> Out:
        if isinstance(out, (OutConst, OutShared)):
            return out
        return self._new_shared(out)

    def replay(self, tx: Any, before: Iterable[Out] = ()) -> tuple[tuple[Out, ...], tuple[Out, ...]]:
        """(`before` made shared, effects): evaluate the effects in order, after the graph call;
        the first effect materialises `before` and every value the later ones use."""
        for check in self.checks:
            check()
        if not self._log:
            return tuple(before), ()
        before = tuple(self._prefetch(o) for o in before)
        calls: list[tuple[Callable, tuple[Out, ...], tuple[str, ...]]] = []
        for entry in self._log:
            kind, kwnames = entry[0], ()
            if kind == "call":
                _, fn, cargs, kwnames = entry
                args = tuple(self._value(tx, a) for a in cargs)
            elif kind == "state":
                fn, args = entry[2](tx)
            elif kind == "attr":
                _, obj_out, name, value = entry
                if value is DELETED:
                    fn, args = delete_attr, (obj_out(tx), OutConst(name))
                else:
                    fn, args = store_attr, (obj_out(tx), OutConst(name), self._value(tx, value))
            elif kind == "global":
                _, g, name, value = entry
                if value is DELETED:
                    fn, args = delete_global, (OutConst(g), OutConst(name))
                else:
                    fn, args = store_global, (OutConst(g), OutConst(name), self._value(tx, value))
            else:
                _, cell_out, value = entry
                fn, args = store_cell, (cell_out, self._value(tx, value))
            calls.append((fn, tuple(self._prefetch(a) for a in args), kwnames))
        loads = [*before, *(a for _, args, _ in calls for a in args if isinstance(a, OutShared))]
        effects = (OutTuple(tuple(loads)), *(OutCall(fn, args, kw) for fn, args, kw in calls))
        return before, effects

    @staticmethod
    def _value(tx: Any, value: "VariableTracker") -> Out:
        return value_out(tx, value)


def fill_cells(obj: Any, cells: tuple) -> Any:
    """`cell.cell_contents = obj` for each cell; returns obj (see SideEffects.defer_fill)."""
    for cell in cells:
        cell.cell_contents = obj
    return obj


def unshare(outs: tuple[Out, ...]) -> tuple[Out, ...]:
    """`outs` with every OutShared that occurs only once replaced by its value (the common
    case: a new list returned once needs no binding)."""
    counts: dict[int, int] = {}

    def count(o):
        if isinstance(o, OutShared):
            counts[o.key] = counts.get(o.key, 0) + 1
            if counts[o.key] > 1:
                return
        for f in _children(o):
            count(f)

    def strip(o):
        if isinstance(o, OutShared) and counts.get(o.key, 0) == 1:
            return strip(o.value)
        if not dataclasses.is_dataclass(o):
            return o
        changes = {}
        for f in dataclasses.fields(o):
            v = getattr(o, f.name)
            if isinstance(v, Out):
                changes[f.name] = strip(v)
            elif isinstance(v, tuple) and any(isinstance(i, Out) for i in v):
                changes[f.name] = tuple(strip(i) if isinstance(i, Out) else i for i in v)
        return dataclasses.replace(o, **changes) if changes else o

    for o in outs:
        count(o)
    return tuple(strip(o) for o in outs)


def _children(o: Out):
    if not dataclasses.is_dataclass(o):
        return
    for f in dataclasses.fields(o):
        v = getattr(o, f.name)
        if isinstance(v, Out):
            yield v
        elif isinstance(v, tuple):
            yield from (i for i in v if isinstance(i, Out))


def value_out(tx: Any, value: "VariableTracker") -> Out:
    """The Out of a value to store: an input the trace never looked at is read back through its
    Source (no guard, no graph input for it); anything else is rebuilt by its tracker."""
    from ferrodyn.variables.base import LazyVariable
    if isinstance(value, LazyVariable) and value.source is not None:
        return OutSource(value.source)
    return tx.realize(value).reconstruct(tx)


def existing_out(var: "VariableTracker") -> Out:
    """How the entry reaches an EXISTING object: through its Source."""
    return OutSource(var.source)

"""Dict trackers (dict, OrderedDict, defaultdict), methods by table.

Owns `DictVariable` (items in a shared `DictState`, one per dict object, so aliases see
mutations; dicts from the frame are EXISTING: mutations are recorded in the SideEffects table
and replayed as `clear(); update(new)`), `DictViewVariable` (`keys()`, `values()`, `items()`:
live views over the same state, as CPython's are), dict iterators (live; a key-set change
during iteration is refused, as CPython raises), and the dict method table. A defaultdict
(made in the frame, or from it: dict_keys.build_object_keyed_dict) keeps its `default_factory`
tracker: a missing `d[k]` calls it and inserts the result (CPython's `__missing__`); without a
factory it raises KeyError. Keys are Python
constants, objects keyed by identity, or the tracked keys of dict_keys.py (tensors, new
objects, frozen dataclass instances).
Does not own `**kwargs` binding (functions.py), module `_modules` dicts' guards (builder.py),
the key model (dict_keys.py) or view set operations and mappingproxies (dict_views.py).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.side_effects import MutationType, replace_dict
from ferrodyn.trace_result import OutCall, OutConst, OutDict, OutTuple
from ferrodyn.variables.base import (
    VariableTracker, instance_has_attr, raised_while_tracing, unsupported)
from ferrodyn.variables.constant import ConstantVariable


def dict_key(tx, key: VariableTracker) -> Any:
    key = tx.realize(key)
    from ferrodyn.variables.user_objects import _ABSENT, identity_dict_key
    obj = identity_dict_key(tx, key)  # (objmodel) an object keying by identity
    if obj is not _ABSENT:
        return obj
    from ferrodyn.variables.dict_keys import tracked_key
    tracked = tracked_key(tx, key)  # a tensor, a new object, a frozen dataclass instance
    if tracked is not None:
        return tracked
    if not key.is_python_constant():
        unsupported(f"dict key {key.describe()}", BreakReason.UNSUPPORTED_TYPE)
    value = key.as_python_constant()
    try:
        hash(value)
    except TypeError as e:
        raised_while_tracing(str(e))
    return value


def key_tracker(k: Any) -> VariableTracker:
    """A key taken out of a dict: a constant (classes, functions and modules included, as
    always); (objmodel) an object that keys by identity has no source to be rebuilt from:
    refused."""
    import types
    from ferrodyn.variables.constant import is_constant_value
    from ferrodyn.variables.dict_keys import key_var
    var = key_var(k)
    if var is not None:
        return var
    if not is_constant_value(k) and not isinstance(k, (type, types.FunctionType, types.ModuleType,
                                                       types.BuiltinFunctionType)):
        from ferrodyn.variables.user_objects import is_identity_hashed
        if is_identity_hashed(k):
            unsupported(f"a {type(k).__name__} object taken out of a dict as a key",
                        BreakReason.UNSUPPORTED_TYPE)
    return ConstantVariable(value=k)


def raise_key_error(cls: type, key: Any):
    """A missing key of a plain dict or OrderedDict: CPython raises `KeyError(key)`, which the
    traced code may catch (a dict subclass could define `__missing__`: refused). The key's
    absence is guarded by the dict's key-set guard."""
    if cls not in (dict, OrderedDict, defaultdict):  # defaultdict: without a factory
        unsupported(f"KeyError: {key!r} on a {cls.__name__}", BreakReason.EXCEPTION)
    from ferrodyn.variables.exceptions import ExceptionVariable, TracedException
    from ferrodyn.variables.dict_keys import key_var
    raise TracedException(ExceptionVariable(cls=KeyError,
                                            args=(key_var(key) or ConstantVariable(value=key),)))


_ABSENT_KEY = object()


@dataclass(eq=False)
class DictState:
    """The contents of one dict object (one per object: see SideEffects' identity table).

    A dict from the frame guards its key set lazily (`keys_guard`, installed by the first read
    of `items` as a whole: length, iteration, views, copies, mutations...); looking up one key
    (`lookup`) guards only that key's presence (the value's accessor fails when the key has
    gone) or, for an absent str key of an exact dict, its absence, as torch.compile does."""
    _items: dict
    mutation_type: MutationType = MutationType.NEW
    cls: type = dict
    side_effects: Any = None   # the table that records mutations of an EXISTING dict
    source: Any = None         # where the entry reaches an EXISTING dict
    obj: Any = None            # the real object of an EXISTING container
    keys_version: int = 0      # bumped when the key set may change (live iterators check it)
    read_only: bool = False    # a view that Python code cannot mutate through (mappingproxy,
                               # Signature.parameters) or whose mutations are not modelled
    default_factory: Any = None  # a defaultdict's factory tracker (ConstantVariable(None): none)
    replay_base: Any = None    # the items of a dict subclass instance: replayed with this
                               # builtin base's methods (past the subclass's overrides)
    keys_guard: Any = None     # () -> None: installs the key-set guard (pending until read)

    @property
    def items(self) -> dict:
        """The items as a whole: the trace now depends on the key set (guarded)."""
        if self.keys_guard is not None:
            install, self.keys_guard = self.keys_guard, None
            install()
        return self._items

    def lookup(self, tx, key) -> Any:
        """The value tracker of `key`, or _ABSENT_KEY, depending only on that key: its presence
        (or absence) is guarded instead of the whole key set where that is expressible."""
        if self.keys_guard is None:
            return self.items.get(key, _ABSENT_KEY)
        from ferrodyn.guard_spec import GuardKind
        from ferrodyn.source import ItemSource
        from ferrodyn.variables.base import LazyVariable
        value = self._items.get(key, _ABSENT_KEY)
        if isinstance(value, LazyVariable) and value.source == ItemSource(self.source, key):
            # present: the item's accessor fails, so the guard fails, once the key has gone
            tx.output.install_guard(value.source, GuardKind.TYPE_MATCH, type(value.value))
            return value
        if value is _ABSENT_KEY and self.cls is dict and type(key) is str:
            tx.output.install_guard(self.source, GuardKind.DICT_LACKS, key)
            return value
        return self.items.get(key, _ABSENT_KEY)  # anything else: the whole key set

    def on_mutate(self, structural: bool = True) -> None:
        if structural:
            self.keys_version += 1
        if self.mutation_type is MutationType.EXISTING:
            self.side_effects.mark_mutated(self, self._replay)

    def _replay(self, tx):
        from ferrodyn.trace_result import OutSource
        from ferrodyn.side_effects import value_out
        from ferrodyn.variables.dict_keys import keys_out
        args = (OutSource(self.source), keys_out(tx, self.items),
                OutTuple(tuple(value_out(tx, v) for v in self.items.values())))
        if self.replay_base is not None:
            return replace_base_items, (OutConst(self.replay_base), *args)
        return replace_dict, args


def replace_base_items(base: type, target: dict, keys: tuple, values: tuple) -> None:
    """`target`'s items (a dict subclass instance) replaced through its builtin base's own
    methods, so no override of the subclass runs (called by generated entries)."""
    base.clear(target)
    for k, v in zip(keys, values):
        base.__setitem__(target, k, v)


@dataclass(frozen=True, eq=False)
class DictVariable(VariableTracker):
    state: DictState = field(default_factory=lambda: DictState({}))

    @staticmethod
    def new(items: dict, cls: type = dict, default_factory: Any = None) -> "DictVariable":
        if cls is defaultdict and default_factory is None:
            default_factory = ConstantVariable(value=None)
        return DictVariable(state=DictState(dict(items), cls=cls, default_factory=default_factory))

    def with_items(self, items: dict) -> "DictVariable":
        """A new dict of this one's kind (a defaultdict keeps its factory) holding `items`: what
        `copy()` and `|` make (a mappingproxy's are plain dicts)."""
        cls = self.state.cls if self.state.cls in (dict, OrderedDict, defaultdict) else dict
        return DictVariable.new(items, cls, self.state.default_factory)

    def python_type(self):
        return self.state.cls

    def identity(self):
        return self.state

    def describe(self):
        return f"dict of {len(self.state._items)}"  # (no guard for a message)

    def mutable(self, structural: bool = True) -> dict:
        if self.state.read_only:
            unsupported(f"mutation of a read-only {self.state.cls.__name__} view",
                        BreakReason.SIDE_EFFECT)
        self.state.on_mutate(structural)
        return self.state.items

    def iterator(self, tx, reverse: bool = False):
        return dict_iterator(self, "keys", reverse)

    def unpack(self, tx):
        return [key_tracker(k) for k in self.state.items]

    def length(self, tx):
        return len(self.state.items)

    def truth(self, tx):
        return bool(self.state.items)

    def contains(self, tx, item):
        return self.state.lookup(tx, dict_key(tx, item)) is not _ABSENT_KEY

    def getitem(self, tx, index):
        key = dict_key(tx, index)
        value = self.state.lookup(tx, key)
        if value is not _ABSENT_KEY:
            return value
        if key not in self.state.items:
            factory = self.state.default_factory
            factory = tx.realize(factory) if factory is not None else None
            if self.state.cls is defaultdict and not _is_none(factory):
                # defaultdict.__missing__: `d[key] = factory()`, returned
                value = tx.realize(factory).call_function(tx, [], {})
                self.mutable()[key] = value
                return value
            raise_key_error(self.state.cls, key)
        return self.state.items[key]

    def setitem(self, tx, index, value):
        key = dict_key(tx, index)
        self.mutable(structural=key not in self.state.items)[key] = value

    def delitem(self, tx, index):
        key = dict_key(tx, index)
        if key not in self.state.items:
            raise_key_error(self.state.cls, key)
        del self.mutable()[key]

    def as_python_constant(self):
        from ferrodyn.variables.base import NotConstant, LazyVariable
        from ferrodyn.variables.dict_keys import is_tracked
        out = {}
        for k, v in self.state.items.items():
            if isinstance(v, LazyVariable) or is_tracked(k):
                raise NotConstant(self)
            out[k] = v.as_python_constant()
        cls = self.state.cls
        if cls is defaultdict:  # the type (and factory) preserved
            return defaultdict(self.state.default_factory.as_python_constant(), out)
        return OrderedDict(out) if cls is OrderedDict else out

    def fx_arg(self, tx):
        from ferrodyn.variables.dict_keys import is_tracked
        if any(is_tracked(k) for k in self.state.items):
            unsupported("a dict keyed by tensors or objects as an argument of a torch function",
                        BreakReason.UNSUPPORTED_TYPE)
        ps, es = {}, {}
        for k, v in self.state.items.items():
            ps[k], es[k] = tx.realize(v).fx_arg(tx)
        return ps, es

    def var_getattr(self, tx, name):
        from ferrodyn.variables.functions import BoundMethodVariable, MethodOf
        if name in _DICT_METHODS and instance_has_attr(self.state.cls, name):
            return BoundMethodVariable(func=MethodOf(name=name), obj=self)
        if name == "default_factory" and self.state.cls is defaultdict:
            return self.state.default_factory
        unsupported(f"attribute {name!r} of {self.state.cls.__name__}",
                    BreakReason.UNSUPPORTED_TYPE)

    def has_attr(self, tx, name):
        return instance_has_attr(self.state.cls, name)

    def call_method(self, tx, name, args, kwargs):
        handler = _DICT_METHODS.get(name)
        if handler is None or not instance_has_attr(self.state.cls, name):
            unsupported(f"{self.state.cls.__name__}.{name}", BreakReason.UNSUPPORTED_CALL)
        return handler(tx, self, *args, **kwargs)

    def reconstruct(self, tx):
        st = self.state
        if st.mutation_type is MutationType.EXISTING:
            from ferrodyn.trace_result import OutSource
            return OutSource(st.source)
        return tx.output.side_effects.shared(st, lambda: dict_out(tx, st))


def _is_none(v) -> bool:
    return isinstance(v, ConstantVariable) and v.value is None


def dict_out(tx, st: DictState):
    """How the entry makes a new dict with `st`'s items (its type and factory kept)."""
    from ferrodyn.variables.dict_keys import is_tracked, keys_out
    values = tuple(tx.realize(v).reconstruct(tx) for v in st.items.values())
    if st.cls in (dict, OrderedDict) and not any(is_tracked(k) for k in st.items):
        return OutDict(tuple(st.items), values, st.cls)
    if st.cls not in (dict, OrderedDict, defaultdict):
        unsupported(f"rebuilding a {st.cls.__name__}", BreakReason.UNSUPPORTED_TYPE)
    factory = tx.realize(st.default_factory).reconstruct(tx) if st.cls is defaultdict \
        else OutConst(None)
    return OutCall(rebuild_dict, (OutConst(st.cls), factory, keys_out(tx, st.items),
                                  OutTuple(values)))


def rebuild_dict(cls: type, factory, keys: tuple, values: tuple) -> dict:
    """A dict, OrderedDict or defaultdict (with `factory`) holding `keys` -> `values` in this
    order (called by generated entries)."""
    d = cls(factory) if cls is defaultdict else cls()
    for k, v in zip(keys, values):
        d[k] = v
    return d


def dict_iterator(d: DictVariable, kind: str, reverse: bool = False):
    """A live iterator over `d`'s keys, values or items. CPython raises RuntimeError when the
    key set changes during iteration: refused here (the frame runs eagerly and raises)."""
    from ferrodyn.variables.lists import IterState, IteratorVariable, TupleVariable
    st = d.state
    version, pos = st.keys_version, [0]

    def step(tx):
        if st.keys_version != version:
            unsupported("dictionary changed size during iteration", BreakReason.EXCEPTION)
        keys = list(st.items)
        if reverse:
            keys.reverse()
        if pos[0] >= len(keys):
            return None
        k = keys[pos[0]]
        pos[0] += 1
        if kind == "keys":
            return key_tracker(k)
        if kind == "values":
            return st.items[k]
        return TupleVariable(items=(key_tracker(k), st.items[k]))

    def rebuild():
        from ferrodyn.variables.lists import IterRebuild
        changed = st.keys_version != version
        return IterRebuild("dict", args=(d,), consts=(kind, pos[0], reverse), refuse=(
            "the dict changed size during iteration" if changed else None))
    return IteratorVariable(state=IterState([], step=step, rebuild=rebuild))


_VIEW_TYPES = {"keys": type({}.keys()), "values": type({}.values()), "items": type({}.items())}


@dataclass(frozen=True, eq=False)
class DictViewVariable(VariableTracker):
    """`d.keys()`, `d.values()`, `d.items()`: a live view of the dict's state."""

    dict_var: DictVariable = None  # type: ignore[assignment]
    kind: str = "keys"

    def python_type(self):
        if self.dict_var.state.cls is not dict:
            unsupported(f"{self.kind}() view of a {self.dict_var.state.cls.__name__}",
                        BreakReason.UNSUPPORTED_TYPE)
        return _VIEW_TYPES[self.kind]

    def identity(self):
        return self

    def describe(self):
        return f"dict_{self.kind}"

    def iterator(self, tx, reverse: bool = False):
        return dict_iterator(self.dict_var, self.kind, reverse)

    def unpack(self, tx):
        return self.iterator(tx).unpack(tx)

    def length(self, tx):
        return len(self.dict_var.state.items)

    def truth(self, tx):
        return bool(self.dict_var.state.items)

    def contains(self, tx, item):
        from ferrodyn.variables.operators import values_equal
        items = self.dict_var.state.items
        if self.kind == "keys":
            return dict_key(tx, item) in items
        if self.kind == "items":
            pair = tx.realize(item)
            parts = pair.unpack(tx) if pair.python_type() is tuple else None
            if parts is None or len(parts) != 2:
                return False
            k = dict_key(tx, parts[0])
            return k in items and values_equal(tx, tx.realize(items[k]), tx.realize(parts[1]))
        return any(values_equal(tx, tx.realize(v), tx.realize(item)) for v in items.values())

    def call_method(self, tx, name, args, kwargs):
        if name == "__contains__" and len(args) == 1 and not kwargs:
            return ConstantVariable(value=self.contains(tx, args[0]))
        if name == "__len__" and not args and not kwargs:
            return ConstantVariable(value=self.length(tx))
        unsupported(f"dict_{self.kind}.{name}", BreakReason.UNSUPPORTED_CALL)

    def has_attr(self, tx, name):
        return hasattr(_VIEW_TYPES[self.kind], name)

    def var_getattr(self, tx, name):
        if name == "mapping":  # a read-only live proxy of the view's dict
            from ferrodyn.variables.dict_views import view_mapping
            return view_mapping(tx, self)
        unsupported(f"attribute {name!r} of dict_{self.kind}", BreakReason.UNSUPPORTED_TYPE)

    def reconstruct(self, tx):
        import operator
        return OutCall(operator.methodcaller(self.kind), (self.dict_var.reconstruct(tx),))


def dict_view_equal(tx, a: VariableTracker, b: VariableTracker) -> bool:
    """`==` with a dict view on either side: keys views compare as sets of keys; items and
    values views are refused where CPython's answer is not certain (values views compare by
    identity)."""
    a, b = tx.realize(a), tx.realize(b)
    for x, y in ((a, b), (b, a)):
        if isinstance(x, DictViewVariable) and x.kind == "values":
            return x is y  # dict_values has no __eq__: identity
    if all(isinstance(v, DictViewVariable) and v.kind == "keys" for v in (a, b)):
        return set(a.dict_var.state.items) == set(b.dict_var.state.items)
    from ferrodyn.variables.dict_views import keys_equal_set
    as_set = keys_equal_set(tx, a, b)  # `d.keys() == {"a", "b"}`: a set comparison
    if as_set is not None:
        return as_set
    unsupported(f"== between {a.describe()} and {b.describe()}", BreakReason.UNSUPPORTED_TYPE)


def _list(items):
    from ferrodyn.variables.lists import ListVariable
    return ListVariable.new(items)


def _view(kind):
    return lambda tx, d: DictViewVariable(dict_var=d, kind=kind)


_keys, _values, _items = _view("keys"), _view("values"), _view("items")


def _get(tx, d, key, default=None):
    value = d.state.lookup(tx, dict_key(tx, key))
    if value is not _ABSENT_KEY:
        return value
    return default if default is not None else ConstantVariable(value=None)


_MISSING = object()


def _pop(tx, d, key, default=_MISSING):
    k = dict_key(tx, key)
    if k in d.state.items:
        return d.mutable().pop(k)
    if default is _MISSING:
        raise_key_error(d.state.cls, k)
    return default


def _setdefault(tx, d, key, default=None):
    k = dict_key(tx, key)
    if k not in d.state.items:
        d.mutable(structural=True)[k] = default if default is not None else ConstantVariable(value=None)
    return d.state.items[k]


def _update(tx, d, /, *args, **kwargs):
    if len(args) > 1:
        unsupported(f"update expected at most 1 argument, got {len(args)}", BreakReason.EXCEPTION)
    other = args[0] if args else None
    items = d.mutable()
    if other is not None:
        other = tx.realize(other)
        from ferrodyn.variables.lists import each_item
        if isinstance(other, DictVariable) and other.state.cls.__iter__ is dict.__iter__:
            items.update(other.state.items)
        elif isinstance(other, DictVariable) or _has_keys(other):
            # CPython's dict_merge for anything but a plain dict storage: a mapping is read
            # through keys() (taken whole first) and __getitem__, never iterated for pairs
            keys = list(each_item(tx, other.call_method(tx, "keys", [], {})))
            for k in keys:
                items[dict_key(tx, k)] = other.call_method(tx, "__getitem__", [k], {})
        else:
            for pair in each_item(tx, other):  # inserted one by one, as CPython does
                k, v = tx.realize(pair).unpack(tx)
                items[dict_key(tx, k)] = v
    items.update(kwargs)
    return ConstantVariable(value=None)


def _has_keys(value) -> bool:
    """Whether `dict.update(value)` takes `value` as a mapping (it has a `keys` attribute)."""
    from ferrodyn.exc import Unsupported
    try:
        cls = value.python_type()
    except Unsupported:
        return False  # trackers without a modelled type are iterables of pairs here
    return hasattr(cls, "keys")


def _copy(tx, d):
    return d.with_items(d.state.items)


_UNION_TYPES = (dict, OrderedDict, defaultdict)


def dict_or(tx, a: DictVariable, b: VariableTracker, inplace: bool = False) -> VariableTracker:
    """`a | b` and `a |= b` for dicts, OrderedDicts and defaultdicts. In place, `b` is anything
    `update` takes. Otherwise both are dicts, and the result's type (and factory) is that of the
    operand whose method runs: `b`'s `__ror__` when b's type is a proper subclass of a's that
    overrides it (OrderedDict, defaultdict), else `a`'s `__or__`; items are a's, then b's."""
    if inplace:
        _update(tx, a, b)
        return a
    b = tx.realize(b)
    if not isinstance(b, DictVariable):
        unsupported(f"TypeError: unsupported operand type(s) for |: {a.describe()} and "
                    f"{b.describe()}", BreakReason.EXCEPTION)
    ta, tb = a.state.cls, b.state.cls
    if ta not in _UNION_TYPES or tb not in _UNION_TYPES:
        unsupported(f"| between a {ta.__name__} and a {tb.__name__}", BreakReason.UNSUPPORTED_TYPE)
    owner = b if tb is not ta and issubclass(tb, ta) else a
    result = owner.with_items(a.state.items)
    result.state.items.update(b.state.items)
    return result


def _or(tx, d, other):
    return dict_or(tx, d, other)


def _ior(tx, d, other):
    return dict_or(tx, d, other, inplace=True)


def _ror(tx, d, other):
    other = tx.realize(other)
    if not isinstance(other, DictVariable):
        unsupported(f"{d.state.cls.__name__}.__ror__ of {other.describe()}",
                    BreakReason.UNSUPPORTED_CALL)
    if d.state.cls is dict:  # dict.__ror__(d, other): other | d, made by dict's own code
        result = DictVariable.new(other.state.items)
        result.state.items.update(d.state.items)
        return result
    owner = d.with_items(other.state.items)  # OrderedDict/defaultdict: their __ror__
    owner.state.items.update(d.state.items)
    return owner


def _popitem(tx, d, last=None):
    """`dict.popitem()` (the last item) / `OrderedDict.popitem(last=True)`."""
    if last is not None and d.state.cls is not OrderedDict:
        unsupported("dict.popitem() takes no arguments", BreakReason.EXCEPTION)
    from_end = True if last is None else _const_arg(tx, last, "popitem")
    if not d.state.items:
        _raise_empty(tx, d, "popitem")
    items = d.mutable()
    key = next(reversed(items)) if from_end else next(iter(items))
    from ferrodyn.variables.lists import TupleVariable
    return TupleVariable(items=(key_tracker(key), items.pop(key)))


def _raise_empty(tx, d, method):
    from ferrodyn.variables.exceptions import ExceptionVariable, TracedException
    msg = "dictionary is empty" if d.state.cls is OrderedDict else f"{method}(): dictionary is empty"
    raise TracedException(ExceptionVariable(cls=KeyError, args=(ConstantVariable(value=msg),)))


def _move_to_end(tx, d, key, last=None):
    """`OrderedDict.move_to_end(key, last=True)`: KeyError when the key is missing."""
    k = dict_key(tx, key)
    to_end = True if last is None else _const_arg(tx, last, "move_to_end")
    if k not in d.state.items:
        raise_key_error(d.state.cls, k)
    items = d.mutable()
    if to_end:
        items[k] = items.pop(k)
    else:
        rest = dict(items)
        value = rest.pop(k)
        items.clear()
        items[k] = value
        items.update(rest)
    return ConstantVariable(value=None)


def _const_arg(tx, v, what):
    v = tx.realize(v)
    if not v.is_python_constant():
        unsupported(f"{what}() with a non-constant flag", BreakReason.UNSUPPORTED_TYPE)
    return bool(v.as_python_constant())


def _clear(tx, d):
    d.mutable().clear()
    return ConstantVariable(value=None)


def _contains(tx, d, key):
    return ConstantVariable(value=d.contains(tx, key))


def _getitem(tx, d, key):
    return d.getitem(tx, key)


_DICT_METHODS: dict[str, Callable] = {
    "keys": _keys, "values": _values, "items": _items, "get": _get, "pop": _pop,
    "setdefault": _setdefault, "update": _update, "copy": _copy, "clear": _clear,
    "__copy__": _copy, "popitem": _popitem, "move_to_end": _move_to_end,
    "__or__": _or, "__ior__": _ior, "__ror__": _ror,
    "__contains__": _contains, "__getitem__": _getitem,
}

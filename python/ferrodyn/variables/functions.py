"""Callable trackers for user code: Python functions, functions made in the frame
(MAKE_FUNCTION: lambdas, nested functions, comprehensions on 3.11, closures), bound methods,
and closure cells; plus argument binding.

Owns how a call binds arguments to a code object's parameters (positional, keyword, defaults,
`*args`, `**kwargs`) and hands the body to the translator for inlining; `CellVariable` (a
closure cell whose contents live in a shared `CellState`); rebuilding a function made in the
frame and its new cells in the entry, once per call (`make_function`; cells made empty, then
filled by `fill_cell`, so a function may close over itself: graph breaks hand them to resume
functions, frames return them or store them into outside objects). Does not own running the
inlined body (symbolic/inline.py), torch functions (torch_fns.py) or `functools.partial`
(functools_vars.py; re-exported here).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from ferrodyn.exc import BreakReason
from ferrodyn.source import AttrSource, GlobalSource, ItemSource, Source
from ferrodyn.variables.base import LazyVariable, VariableTracker, unsupported
from ferrodyn.variables.constant import ConstantVariable


# ---- cells ---------------------------------------------------------------------------------

@dataclass(eq=False)
class CellState:
    """The contents of one cell object. EXISTING cells (the frame's closure, closures of
    functions from outside the frame; one state per cell object, keyed in the SideEffects
    table) record stores there, replayed as `cell.cell_contents = value` through `cell_out`."""
    content: VariableTracker | None = None
    mutation_type: Any = None            # side_effects.MutationType; None means NEW
    side_effects: Any = None
    cell_out: Any = None                 # Out reaching the cell object in the entry (or None)
    fill_key: Any = field(default_factory=object)  # `shared` key of the rebuilt, filled cell


@dataclass(frozen=True, eq=False)
class CellVariable(VariableTracker):
    state: CellState = field(default_factory=CellState)

    def identity(self):
        return self.state

    def describe(self):
        return "cell"

    def load(self, tx, name: str) -> VariableTracker:
        if self.state.content is None:
            unsupported(f"free variable {name!r} referenced before assignment",
                        BreakReason.EXCEPTION)
        return self.state.content

    def store(self, tx, name: str, value: VariableTracker) -> None:
        st = self.state
        if st.mutation_type is not None:
            if st.cell_out is None:
                unsupported(f"assignment to nonlocal {name!r} of a function that cannot be "
                            f"reached from the frame", BreakReason.SIDE_EFFECT)
            st.side_effects.store_cell(st.cell_out, value)
        st.content = value

    def reconstruct(self, tx):
        """The cell object itself (graph breaks hand a frame's cells to its resume function):
        an existing cell through the Out that reaches it; a cell made in the frame, once per
        entry call (every function closing over it, and the resume function, get that one
        object) with its contents at the break or return.

        A cell made in the frame is made empty, then filled with its contents (`fill_cell`),
        so that contents which refer back to the cell rebuild: a nested function that calls
        itself has its own cell in its closure. When the contents are the very object being
        rebuilt (the function, reached through its closure), the cell is filled right after
        that object is made (`SideEffects.defer_fill`). Nothing in the entry reads a rebuilt
        cell, so it is filled before anything can see it."""
        from ferrodyn.trace_result import OutCall
        st = self.state
        if st.mutation_type is not None:
            if st.cell_out is None:
                unsupported("a cell that cannot be reached from the frame", BreakReason.OTHER)
            return st.cell_out
        table = tx.output.side_effects
        cell = table.shared(st, lambda: OutCall(types.CellType, ()))
        if st.content is None or table.is_building(st.fill_key):
            return cell
        content = tx.realize(st.content)
        if table.is_building(content.identity()):
            table.defer_fill(content.identity(), cell)
            return cell
        return table.shared(st.fill_key, lambda: OutCall(fill_cell, (
            cell, content.reconstruct(tx))))


def fill_cell(cell: types.CellType, value: Any) -> types.CellType:
    """`cell.cell_contents = value`; returns the cell (CellVariable.reconstruct)."""
    cell.cell_contents = value
    return cell


def existing_cell(tx, cell: types.CellType, cell_source: Source | None,
                  content_source: Source | None = None, cell_out: Any = None) -> "CellVariable":
    """The one tracker of a cell object from outside the frame (keyed by identity, so every
    function closing over it sees stores made through any of them)."""
    from ferrodyn.side_effects import MutationType
    from ferrodyn.trace_result import OutSource
    table = tx.output.side_effects
    hit = table.tracked(cell, cell_source)  # one cell reached two ways: the aliasing guard
    if hit is not None:
        return hit
    if content_source is None and cell_source is not None:
        content_source = AttrSource(cell_source, "cell_contents")
    try:
        content = _lazy(cell.cell_contents, content_source)
    except ValueError:
        content = None
    if cell_out is None and cell_source is not None:
        cell_out = OutSource(cell_source)
    var = CellVariable(state=CellState(content, MutationType.EXISTING, table, cell_out))
    return table.track(cell, cell_source, var)


def build_cell(tx, cell: types.CellType, source: Source) -> "CellVariable":
    """The builder's entry for a cell object read from the frame (a resume function's
    argument: the cell of the frame it continues)."""
    from ferrodyn.guard_spec import GuardKind
    tx.output.install_guard(source, GuardKind.TYPE_MATCH, types.CellType)
    return existing_cell(tx, cell, source)


# ---- binding -------------------------------------------------------------------------------

def bind_args(code: types.CodeType, fname: str, args: list, kwargs: dict,
              defaults: tuple, kwdefaults: dict) -> dict[str, VariableTracker]:
    """Map call arguments onto the parameters of `code`, as CPython does (errors give up:
    eager raises the TypeError)."""
    from ferrodyn.variables.dicts import DictVariable
    from ferrodyn.variables.lists import TupleVariable

    def fail(msg):
        unsupported(f"{fname}() {msg}", BreakReason.EXCEPTION)

    argc, posonly, kwonly = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    names = code.co_varnames
    pos_names, kw_names = names[:argc], names[argc:argc + kwonly]
    i = argc + kwonly
    varargs = varkw = None
    if code.co_flags & inspect.CO_VARARGS:
        varargs = names[i]
        i += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        varkw = names[i]
    bound: dict[str, VariableTracker] = {}
    for name, value in zip(pos_names, args):
        bound[name] = value
    extra = args[argc:]
    if extra and varargs is None:
        fail(f"takes {argc} positional arguments but {len(args)} were given")
    if varargs is not None:
        bound[varargs] = TupleVariable(items=tuple(extra))
    spill: dict[str, VariableTracker] = {}
    for k, v in kwargs.items():
        if k in pos_names[posonly:] or k in kw_names:
            if k in bound:
                fail(f"got multiple values for argument {k!r}")
            bound[k] = v
        elif varkw is not None:
            spill[k] = v
        else:
            fail(f"got an unexpected keyword argument {k!r}")
    first_default = argc - len(defaults)
    for idx, name in enumerate(pos_names):
        if name not in bound:
            if idx >= first_default:
                bound[name] = defaults[idx - first_default]
            else:
                fail(f"missing required argument {name!r}")
    for name in kw_names:
        if name not in bound:
            if name in kwdefaults:
                bound[name] = kwdefaults[name]
            else:
                fail(f"missing required keyword-only argument {name!r}")
    if varkw is not None:
        bound[varkw] = DictVariable.new(spill)
    return bound


# ---- functions -----------------------------------------------------------------------------

class InlinableFunction(VariableTracker):
    """A function whose body the translator inlines. Subclasses say where its pieces are."""

    def code(self) -> types.CodeType:
        raise NotImplementedError

    def fn_globals(self) -> dict:
        raise NotImplementedError

    def globals_source(self, tx) -> Callable[[str], Source | None]:
        raise NotImplementedError

    def defaults(self, tx) -> tuple:
        raise NotImplementedError

    def kwdefaults(self, tx) -> dict:
        raise NotImplementedError

    def closure(self, tx) -> tuple:
        raise NotImplementedError

    def name(self) -> str:
        return self.code().co_name

    def describe(self):
        return f"function {self.name()}"

    def call_function(self, tx, args, kwargs):
        from ferrodyn.symbolic.inline import inline_function
        from ferrodyn.variables.builtins import reordered_call
        fn = getattr(self, "fn", None)
        reordered = reordered_call(tx, fn, args, kwargs) if fn is not None else None
        if reordered is not None:
            return reordered
        bound = bind_args(self.code(), self.name(), list(args), dict(kwargs),
                          self.defaults(tx), self.kwdefaults(tx))
        return inline_function(tx, self, bound)

    def python_type(self):
        return types.FunctionType

    def has_attr(self, tx, name):
        # attributes of every function (getset descriptors on the function type), else the
        # function's own `__dict__`
        return hasattr(types.FunctionType, name) or name in self.own_dict_keys(tx)

    def own_dict_keys(self, tx) -> tuple:
        return ()


@dataclass(frozen=True, eq=False)
class UserFunctionVariable(InlinableFunction):
    """A real Python function object (read from globals, attributes, closures...)."""

    fn: types.FunctionType = None  # type: ignore[assignment]
    by_code: bool = False  # a closure guarded by its code, not its identity (builder.py)

    def code(self):
        return self.fn.__code__

    def identity(self):
        return ("obj", id(self.fn))

    def as_python_constant(self):
        if self.by_code:  # another call's closure passes the same guards
            unsupported(f"closure {self.fn.__qualname__} as a constant", BreakReason.OTHER)
        return self.fn

    def fn_globals(self):
        return self.fn.__globals__

    def globals_source(self, tx):
        if self.fn.__globals__ is tx.output.f_globals:
            return GlobalSource
        if self.source is not None:
            base = AttrSource(self.source, "__globals__")
            return lambda name: ItemSource(base, name)
        return lambda name: None

    def _sub(self, attr: str) -> Source | None:
        return AttrSource(self.source, attr) if self.source is not None else None

    def defaults(self, tx):
        vals = self.fn.__defaults__ or ()
        base = self._sub("__defaults__")
        return tuple(_lazy(v, ItemSource(base, i) if base else None) for i, v in enumerate(vals))

    def kwdefaults(self, tx):
        vals = self.fn.__kwdefaults__ or {}
        base = self._sub("__kwdefaults__")
        return {k: _lazy(v, ItemSource(base, k) if base else None) for k, v in vals.items()}

    def closure(self, tx):
        cells = self.fn.__closure__ or ()
        base = self._sub("__closure__")
        out = []
        for i, cell in enumerate(cells):
            out.append(existing_cell(tx, cell, ItemSource(base, i) if base else None))
        return tuple(out)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            if self.by_code:  # another closure of the code may differ (functools.wraps)
                return _lazy(getattr(self.fn, name), self._sub(name))
            return ConstantVariable(value=getattr(self.fn, name))
        if name == "__code__":
            if self.source is not None:  # `fn.__code__` is assignable: guard which code it is
                from ferrodyn.guard_spec import GuardKind
                tx.output.install_guard(self._sub("__code__"), GuardKind.ID_MATCH,
                                        self.fn.__code__)
            return ConstantVariable(value=self.fn.__code__)
        if name in _FN_OBJECT_ATTRS:
            return _lazy(getattr(self.fn, name), self._sub(name))
        if name == "__class__":  # not assignable on a function: no guard
            from ferrodyn.variables.builder import build_unsourced
            return build_unsourced(type(self.fn))
        if name in self.own_dict_keys(tx):  # `__wrapped__`, attributes set by decorators
            return tx.realize(self.var_getattr(tx, "__dict__")).getitem(
                tx, ConstantVariable(value=name))
        if hasattr(types.FunctionType, name):
            return super().var_getattr(tx, name)
        unsupported(f"AttributeError: function {self.fn.__qualname__!r} has no attribute "
                    f"{name!r}", BreakReason.EXCEPTION)

    def own_dict_keys(self, tx):
        if self.source is not None:  # reading the function's __dict__ guards its keys
            d = tx.realize(self.var_getattr(tx, "__dict__"))
            state = getattr(d, "state", None)
            if state is not None:
                state.items  # noqa: B018  (a dict guards its key set when its items are read)
        return tuple(self.fn.__dict__)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        if self.source is None:
            return OutConst(self.fn)
        return super().reconstruct(tx)


# Function attributes that are objects read like any frame value (guarded when used).
_FN_OBJECT_ATTRS = ("__defaults__", "__kwdefaults__", "__dict__", "__globals__", "__closure__",
                    "__annotations__", "__builtins__")


def _lazy(value: Any, source: Source | None) -> VariableTracker:
    if source is None:
        from ferrodyn.variables.builder import build_unsourced
        return build_unsourced(value)
    return LazyVariable(source=source, value=value)


@dataclass(frozen=True, eq=False)
class NestedFunctionVariable(InlinableFunction):
    """A function made by MAKE_FUNCTION while tracing (lambda, nested def, comprehension)."""

    fcode: types.CodeType = None  # type: ignore[assignment]
    globals_dict: dict = None  # type: ignore[assignment]
    globals_resolver: Callable = None  # type: ignore[assignment]
    fdefaults: tuple = ()
    fkwdefaults: dict = field(default_factory=dict)
    fclosure: tuple = ()
    fannotations: Any = None  # MAKE_FUNCTION's annotations tuple (name, value, ...), or None

    def code(self):
        return self.fcode

    def reconstruct(self, tx):
        """The function object, made once per entry call (graph breaks: a function made before
        the break and live after it) with the same cells as the frame's (CellVariable)."""
        from ferrodyn.trace_result import OutCall, OutConst, OutTuple

        def part(v):
            return tx.realize(v).reconstruct(tx)

        def build():
            kw = tuple(self.fkwdefaults)
            return OutCall(make_function, (
                OutConst(self.fcode), OutConst(self.globals_dict),
                OutTuple(tuple(part(v) for v in self.fdefaults)),
                OutConst(kw), OutTuple(tuple(part(self.fkwdefaults[k]) for k in kw)),
                OutConst(None) if self.fannotations is None else part(self.fannotations),
                OutTuple(tuple(part(c) for c in self.fclosure))))
        return tx.output.side_effects.shared(self, build)

    def fn_globals(self):
        return self.globals_dict

    def globals_source(self, tx):
        return self.globals_resolver

    def defaults(self, tx):
        return self.fdefaults

    def kwdefaults(self, tx):
        return self.fkwdefaults

    def closure(self, tx):
        return self.fclosure

    def var_getattr(self, tx, name):
        getter = _NESTED_FN_ATTRS.get(name)
        if getter is not None:
            return getter(self)
        return super().var_getattr(tx, name)


def make_function(code, f_globals, defaults, kw_names, kw_values, annotations, closure):
    """What MAKE_FUNCTION makes (the entry rebuilds a NestedFunctionVariable with it)."""
    fn = types.FunctionType(code, f_globals, None, defaults or None, closure or None)
    if kw_names:
        fn.__kwdefaults__ = dict(zip(kw_names, kw_values))
    if annotations is not None:
        fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2]))
    return fn


def _none_or(value, make):
    return ConstantVariable(value=None) if not value else make(value)


def _nested_module(fn: NestedFunctionVariable):
    return ConstantVariable(value=(fn.globals_dict or {}).get("__name__"))


# Attributes of a function made while tracing; its `__dict__` (empty, but writable) and its
# `__globals__` are not modelled.
_NESTED_FN_ATTRS: dict[str, Callable] = {
    "__name__": lambda f: ConstantVariable(value=f.fcode.co_name),
    "__qualname__": lambda f: ConstantVariable(value=f.fcode.co_qualname),
    "__code__": lambda f: ConstantVariable(value=f.fcode),
    "__module__": _nested_module,
    "__defaults__": lambda f: _none_or(f.fdefaults, lambda v: _tuple(v)),
    "__kwdefaults__": lambda f: _none_or(f.fkwdefaults, lambda v: _dict(v)),
}


def _tuple(items):
    from ferrodyn.variables.lists import TupleVariable
    return TupleVariable(items=tuple(items))


def _dict(items):
    from ferrodyn.variables.dicts import DictVariable
    return DictVariable.new(items)


# ---- methods -------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class MethodOf(VariableTracker):
    """Placeholder function of a builtin-container method: the call goes to
    `obj.call_method(name, ...)`."""

    name: str = ""

    def describe(self):
        return f"method {self.name}"


@dataclass(frozen=True, eq=False)
class BoundMethodVariable(VariableTracker):
    func: VariableTracker = None  # type: ignore[assignment]
    obj: VariableTracker = None  # type: ignore[assignment]

    def describe(self):
        return f"bound {self.func.describe()}"

    def python_type(self):
        return types.MethodType

    def call_function(self, tx, args, kwargs):
        if isinstance(self.func, MethodOf):
            return self.obj.call_method(tx, self.func.name, list(args), dict(kwargs))
        return tx.realize(self.func).call_function(tx, [self.obj, *args], kwargs)

    def var_getattr(self, tx, name):
        # method_getattro: the method type's own attributes, then the function's
        if name == "__self__":
            return self.obj
        if name == "__func__" and not isinstance(self.func, MethodOf):
            return self.func
        if not isinstance(self.func, MethodOf) and (
                name == "__doc__" or not hasattr(types.MethodType, name)):
            return tx.realize(self.func).var_getattr(tx, name)
        return super().var_getattr(tx, name)

    def has_attr(self, tx, name):
        if hasattr(types.MethodType, name):
            return True
        if isinstance(self.func, MethodOf):
            return super().has_attr(tx, name)
        return tx.realize(self.func).has_attr(tx, name)


@dataclass(frozen=True, eq=False)
class OpaqueVariable(VariableTracker):
    """A frame value of a type the converter does not model. It may be passed around and
    returned unchanged (its type is guarded); any other use gives up."""

    value: Any = None

    def python_type(self):
        return type(self.value)

    def identity(self):
        return ("obj", id(self.value))

    def describe(self):
        return f"{type(self.value).__name__} object (not modelled)"

    def truth(self, tx):
        unsupported(f"truth value of {self.describe()}", BreakReason.UNSUPPORTED_TYPE)


# `functools.partial` lives with the other argument-holding callables (re-exported here).
from ferrodyn.variables.functools_vars import PartialVariable  # noqa: E402,F401

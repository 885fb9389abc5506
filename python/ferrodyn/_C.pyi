"""Stubs for ferrodyn._C, the Rust core. This file is the contract between the Rust crate and the
Python package: the converter codes against it, the crate implements it, and
`tests/test_stubs.py` checks the two agree.

Owns: the frame hook (`set_eval_frame`), the per-code cache, guard trees, tensor metadata reads
and the weak-key dictionaries. Never decides what to guard or how to trace.
"""

import weakref
from types import CodeType, CellType
from typing import Any, Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence

PYTHON_BUILT_FOR: tuple[int, int]

# ---------------------------------------------------------------------------------------------
# Frame hook (rust/eval_frame)
# ---------------------------------------------------------------------------------------------

class FrameView:
    """What the callback sees of an intercepted frame on a cache miss. Frozen; no frame object.

    `args` are the frame's argument slots in `co_varnames` order: the positional and
    keyword-only parameters, then the `*args` tuple and the `**kwargs` dict where the code has
    them (defaults already applied). `closure` is the function's closure cells in
    `co_freevars` order, or None.
    """

    @property
    def f_code(self) -> CodeType: ...
    @property
    def f_globals(self) -> dict[str, Any]: ...
    @property
    def f_builtins(self) -> dict[str, Any]: ...
    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def closure(self) -> tuple[CellType, ...] | None: ...
    @property
    def f_locals(self) -> dict[str, Any]:
        """`dict(zip(co_varnames, args))`, built on first access."""

class CacheEntry:
    """A compiled entry for one code object: what the callback returns on a miss.

    On a hit the hook calls `fn(*argument_slots, *closure_cells)`: the frame's argument slots
    in the order of `FrameView.args`, followed by the closure cells (cell objects, in
    `co_freevars` order) when the code has free variables, followed by the values of the guard
    tree's exported nodes (`GuardBuilder.export`), if any. `fn`'s return value is the frame's.

    `direct=(graph, ((is_export, index), ...), out, fence)`: when `fn` only returns
    `graph(*inputs)[out]`, a hit calls `graph` itself (each input argument slot `index`, or
    exported value `index`), under `set_eval_frame(False)` when `fence`, and returns item `out`
    of its result, without running `fn`'s frame (unless a trace or profile function is set).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        guards: GuardTree,
        *,
        backend_id: int = 0,
        compile_id: str = "",
        direct: tuple[Callable[..., Any], tuple[tuple[bool, int], ...], int, bool] | None = None,
    ) -> None: ...
    @property
    def has_direct_call(self) -> bool: ...
    @property
    def fn(self) -> Callable[..., Any]: ...
    @property
    def guards(self) -> GuardTree: ...
    @property
    def backend_id(self) -> int: ...
    @property
    def compile_id(self) -> str: ...
    @property
    def hits(self) -> int: ...

Callback = Callable[[FrameView], CacheEntry | None]

class BackendCallback:
    """A callback tied to a backend. Installed with `set_eval_frame`, it calls `callback` on a
    miss, and lookups run only entries whose `backend_id` equals `backend_id` or is 0 (entries
    of other backends are neither run nor counted as guard failures; the per-code limit counts
    them all). A plain callable, and run-only `False`, act as backend id 0: they run entries
    of every backend, as torch's run-only mode does. `set_eval_frame` returns this object as
    the prior callback, so `set_eval_frame(prior)` restores the backend id too. Calling it
    calls `callback`."""

    def __init__(self, callback: Callback, backend_id: int) -> None: ...
    @property
    def callback(self) -> Callback: ...
    @property
    def backend_id(self) -> int: ...
    def __call__(self, frame: FrameView) -> CacheEntry | None: ...

class CompiledFunction:
    """`fn` under a frame callback, called natively (what `ferrodyn.compile(fn)` returns):
    each call installs `callback` (as `set_eval_frame` would; parsed once, here) as this
    thread's callback, calls `fn(*args, **kwargs)` and restores the previous callback, also
    when `fn` raises. Binds as a method (`__get__`) and has a `__dict__` (for
    `functools.update_wrapper`)."""

    def __init__(self, fn: Callable[..., Any], callback: Callback | BackendCallback | bool | None) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __get__(self, obj: Any, owner: Any = None) -> Any: ...
    @property
    def _ferrodyn_orig(self) -> Callable[..., Any]: ...
    @property
    def _ferrodyn_installed(self) -> Any: ...

class ModuleCall:
    """`OptimizedModule.__call__` of one wrapper: with no hooks on `wrapper`, `orig` or torch's
    global hook dicts (and `_compiled_call_impl` unset, `wrapper.forward is target`, no JIT
    tracing), it calls `orig.forward` (or `target`'s function when `inline`) under `target`'s
    callback; with hooks on `orig` only, `target`; otherwise `nn.Module.__call__(wrapper, ...)`.
    Checked on every call. Holds `wrapper` weakly."""

    def __init__(self, wrapper: Any, orig: Any, target: CompiledFunction, inline: bool) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    @property
    def _stamped(self) -> tuple[bool, bool, bool]:
        """Which "no hooks" verdicts are remembered (torch's globals, wrapper, original); all
        False where dict version tags are not read (3.13)."""
    @property
    def _forward_stamped(self) -> bool:
        """Whether `type(orig).forward` is remembered and bound to `orig` without a lookup."""

class ResumeCall:
    """The `self` data of a `resume_call` builtin (one resume function); not called directly."""

def resume_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The callable an entry calls its resume function `fn` through: a builtin that, when this
    thread's hook is on and `fn`'s code cache has an entry whose guards pass on the call's
    positional arguments (with `fn`'s globals and builtins), calls that entry with them
    directly (no frame of `fn`); otherwise calls `fn` (the hook then decides as for any frame).
    `fn` itself when it is not a plain function without closure, `*args`, `**kwargs`,
    keyword-only parameters or generator/coroutine flags."""

class ModuleCallSlot:
    """The class-level `__call__` descriptor of OptimizedModule: on an instance it gives the
    instance's `_ferrodyn_call` (a ModuleCall), or `nn.Module.__call__` bound to it."""

    def __init__(self) -> None: ...
    def __get__(self, obj: Any, owner: Any = None) -> Any: ...

def set_eval_frame(
    callback: Callback | BackendCallback | bool | None,
) -> Callback | BackendCallback | bool | None:
    """Set this thread's callback and return the previous one.

    None: off. False: run cached entries only (a miss runs the frame normally). A callable:
    on a miss it is called with a FrameView (with the hook off for its own frames) and returns
    a CacheEntry, which is inserted and run, or None, which runs the frame normally. An
    exception from the callback propagates out of the intercepted call. A BackendCallback:
    the same, limited to its backend's entries. The interpreter-wide PEP 523 function is
    installed only while at least one thread has a non-None callback.
    """

def get_eval_frame() -> Callback | BackendCallback | bool | None:
    """This thread's callback."""

def skip_code(code: CodeType) -> None:
    """Mark `code` SKIP: its frames are never intercepted (cache kept but not consulted)."""

def run_only_code(code: CodeType) -> None:
    """Mark `code` RUN_ONLY: its frames use cached entries but never call the callback."""

def code_flags(code: CodeType) -> str:
    """"default", "skip" or "run_only"."""

# ---------------------------------------------------------------------------------------------
# Cache (rust/cache)
# ---------------------------------------------------------------------------------------------

def cache_entries(code: CodeType) -> list[CacheEntry]:
    """The live entries of `code`, most recently hit first."""

def insert_entry(code: CodeType, entry: CacheEntry) -> None:
    """Insert an entry at the front of `code`'s cache (used by tests and by the converter's
    recompile path); the per-code limit applies: at the limit the entry is not inserted and the
    one-time RuntimeWarning is given. The entry function's own code (a Python function with
    another code object) is marked SKIP, so a hit runs its frame directly."""

def set_cache_size_limit(limit: int) -> None:
    """Entries per code object (default 8). Past it a frame of that code runs normally and a
    RuntimeWarning says so once per code object."""

def get_cache_size_limit() -> int: ...

def cache_stats() -> dict[str, int]:
    """Counters since the last reset: "hits", "misses" (callback calls), "guard_failures"
    (entries whose guards failed during lookups), "limit_reached" (frames run normally because
    their code is at the limit), "entries" (live entries)."""

def reset() -> None:
    """Drop every cache entry of every code object (and the objects they hold), clear the
    SKIP/RUN_ONLY flags, zero the counters."""

# ---------------------------------------------------------------------------------------------
# Guard trees (rust/guards)
# ---------------------------------------------------------------------------------------------

class GuardNode:
    """An accessor in a tree under construction: a handle returned by GuardBuilder methods."""

    @property
    def source(self) -> str:
        """The source expression, e.g. "L['x'].weight" or "G['config'].flag"."""

class GuardBuilder:
    """Builds a GuardTree. Accessors are deduplicated: asking twice for the same path returns
    the same node. Leaves are evaluated cheap-first (type and identity before values, tensor
    matches last), each tree failing fast.

    `f_globals` / `f_builtins` are the dicts that `global_` and `builtin` read when `check`
    is not given others (the hook always passes the frame's own).
    """

    def __init__(
        self,
        f_globals: dict[str, Any] | None = None,
        f_builtins: dict[str, Any] | None = None,
    ) -> None: ...

    # -- accessors: each returns a node whose value is computed from its parent's ----------
    def local(self, index: int, name: str) -> GuardNode:
        """Argument slot `index` (`L['name']`); with a mapping, `check` reads key `name`."""
    def global_(self, name: str) -> GuardNode:
        """`G['name']`: the frame's globals. A missing key fails the guard."""
    def builtin(self, name: str) -> GuardNode:
        """`B['name']`: the frame's builtins."""
    def closure_cell(self, index: int, name: str) -> GuardNode:
        """Contents of closure cell `index` (`C['name']`); an empty cell fails the guard."""
    def attr(self, parent: GuardNode, name: str) -> GuardNode:
        """`parent.name` (generic getattr; an AttributeError fails the guard)."""
    def item(self, parent: GuardNode, key: Any) -> GuardNode:
        """`parent[key]`: exact list/tuple index or exact dict key without calling Python;
        other containers through `__getitem__`. A missing key fails the guard."""
    def dict_of(self, parent: GuardNode) -> GuardNode:
        """`parent.__dict__` (the instance dict, read directly)."""
    def type_of(self, parent: GuardNode) -> GuardNode:
        """`type(parent)`."""
    def len_of(self, parent: GuardNode) -> GuardNode:
        """`len(parent)` as an int node."""
    def set_item(self, parent: GuardNode, index: int) -> GuardNode:
        """The `index`-th element of an exact set or frozenset, or key of an exact dict, in
        iteration order (`list(parent)[index]`); another type or a shorter one fails the guard."""
    def dict_item(self, parent: GuardNode, key: Any) -> GuardNode:
        """`dict.__getitem__(parent, key)`: the item in the storage of any dict instance
        (subclasses included), without running `__getitem__`/`__missing__` overrides; not a dict
        or no such key fails the guard."""
    def dict_value(self, parent: GuardNode, index: int) -> GuardNode:
        """The `index`-th value of an exact dict in insertion order
        (`list(parent.values())[index]`); another type or a shorter dict fails the guard."""
    def tensor_size(self, parent: GuardNode, dim: int) -> GuardNode:
        """`parent.size()[dim]` as an int node (read directly for plain tensors)."""
    def tensor_stride(self, parent: GuardNode, dim: int) -> GuardNode:
        """`parent.stride()[dim]` as an int node."""

    def export(self, node: GuardNode) -> int:
        """Hand `node`'s value to the entry function on every passing check: the hook calls
        `entry(*argument_slots, *closure_cells, *exported_values)`, in export order (the
        returned position). A node whose value cannot be read fails the check."""

    # -- leaves ----------------------------------------------------------------------------
    def type_is(self, node: GuardNode, typ: type) -> None:
        """`type(node) is typ` (pointer comparison)."""
    def is_(self, node: GuardNode, obj: Any) -> None:
        """`node is obj`. Held weakly where `obj` is weakly referenceable: the guard fails
        once `obj` has died."""
    def is_none(self, node: GuardNode) -> None: ...
    def is_not_none(self, node: GuardNode) -> None: ...
    def equals(self, node: GuardNode, value: Any) -> None:
        """`node == value` for None, bool, int, float, str, bytes and (nested) tuples of these;
        the node's type must match exactly too (True does not equal 1 here). TypeError for
        other values."""
    def length_is(self, node: GuardNode, n: int) -> None:
        """`len(node) == n`."""
    def dict_keys(self, node: GuardNode, keys: Sequence[Any]) -> None:
        """`list(node.keys()) == keys` (exact dict; order matters)."""
    def dict_lacks(self, node: GuardNode, key: Any) -> None:
        """`key not in node` (exact dict: an instance `__dict__` that must not shadow a class
        attribute)."""
    def dicts_empty(self, node: GuardNode, keys: Sequence[str]) -> None:
        """`len(node[k]) == 0` for every key (a module's hook dicts) as one leaf; the replay
        reads only the remembered values' lengths while `node` keeps its version. ValueError
        for no keys."""
    def tensor_match(
        self,
        node: GuardNode,
        example: Any,
        *,
        dynamic_dims: Sequence[int] = (),
        check_strides: bool = True,
    ) -> None:
        """`node` is a tensor like `example`: the same exact Python type, dtype, device,
        requires_grad, ndim, dispatch key set, and sizes and strides at every dimension not in
        `dynamic_dims`."""
    def shape_guard(
        self,
        expr: str,
        symbols: Sequence[tuple[GuardNode, str, int]],
    ) -> None:
        """A symbolic-shape guard evaluated natively: `expr` in prefix form (integer literals,
        `true`/`false`, symbol `s<k>` = `symbols[k]`, n-ary `add:<n>` `mul:<n>` `min:<n>`
        `max:<n>` `and:<n>` `or:<n>`, binary `floordiv` `mod` `pow` `eq` `ne` `lt` `le` `gt`
        `ge`, unary `not` `neg`; Python's floor semantics). Each symbol is `(node, kind, dim)`
        with kind "size"/"stride" (of the tensor at `node`, at `dim`), "storage_offset" or
        "int" (an exact Python int; `dim` ignored). Overflow and division by zero fail the
        guard. Explained in source terms: `2 <= L['x'].size()[0] (got 1)`. ValueError for a
        malformed expression or an unbound symbol."""
    def no_handled_exception(self) -> None:
        """A leaf that passes while no exception is being handled by the frame's caller
        (`sys.exception() is None`)."""
    def global_state(self) -> None:
        """Torch's global state as it is now: grad mode, default dtype, deterministic
        algorithms, autocast (enabled and dtype, per device type)."""
    def aliasing(
        self,
        nodes: Sequence[GuardNode],
        groups: Sequence[int],
        storages: Sequence[tuple[int, int] | None],
    ) -> None:
        """One leaf over several nodes: values with equal `groups` entries are the same object
        and values with different entries are not; for tensors (`storages[i]` not None: a
        storage group and the traced storage offset), equal storage groups share one storage
        (at the traced offsets where the group has several members) and different ones do
        not. Storage identity is read directly where verified, else through
        `untyped_storage()`. Explained as "L['a'] and L['b'] are now the same object"."""
    def build(self) -> GuardTree:
        """Finish; the builder cannot be used afterwards."""

def _dict_version(d: dict[Any, Any]) -> int | None:
    """A dict's version tag as the guard replay path reads it (None on 3.13); for tests."""

def _weakref_direct() -> bool:
    """Whether identity leaves read a weakref's referent directly (verified at import)."""

class GuardTree:
    """An immutable tree of accessors and leaves."""

    def check(
        self,
        f_locals: Mapping[str, Any] | Sequence[Any],
        f_globals: dict[str, Any] | None = None,
        f_builtins: dict[str, Any] | None = None,
        closure: tuple[CellType, ...] | None = None,
    ) -> bool:
        """True if every guard passes. `f_locals` is a name->value mapping or the argument
        slots in order. Exceptions from user code (a property raising) count as failure."""
    def explain(
        self,
        f_locals: Mapping[str, Any] | Sequence[Any],
        f_globals: dict[str, Any] | None = None,
        f_builtins: dict[str, Any] | None = None,
        closure: tuple[CellType, ...] | None = None,
    ) -> str | None:
        """None if `check` would pass, else the first failing guard as a readable expression,
        e.g. "L['x'].size()[0] == 4 (got 5)" or "type(L['y']) is int"."""
    def leaves(self) -> list[str]:
        """Every leaf's expression, in evaluation order."""
    @property
    def replayable(self) -> bool:
        """Whether every accessor and leaf can be decided from raw reads (the replay path:
        remembered dict lookups proven current by dict/type version tags)."""
    def _replay(self, f_locals: Mapping[str, Any] | Sequence[Any], f_globals: dict[str, Any] | None = None,
                f_builtins: dict[str, Any] | None = None,
                closure: tuple[CellType, ...] | None = None) -> bool | None:
        """What the replay path alone decides (None: it cannot); for tests."""
    def _full_check(self, f_locals: Mapping[str, Any] | Sequence[Any], f_globals: dict[str, Any] | None = None,
                    f_builtins: dict[str, Any] | None = None,
                    closure: tuple[CellType, ...] | None = None) -> bool:
        """The full path's outcome alone (it refreshes the replay's memory); for tests."""
    def _plan_stats(self) -> tuple[int, int, int]:
        """(nodes read through an earlier twin accessor, leaves skipped after an identical one,
        tensor leaves checked from packed copies) of the replay plan; for tests."""
    def _nodes(self) -> list[str]:
        """The accessors' source expressions, in node order; for tests."""
    def __len__(self) -> int:
        """Number of leaves."""

# ---------------------------------------------------------------------------------------------
# Tensor metadata (rust/tensor)
# ---------------------------------------------------------------------------------------------

def _aliasing_fast_path() -> bool:
    """Whether the aliasing leaf reads tensor storage identity directly (verified offsets)."""

def tensor_fast_path() -> bool:
    """Whether direct metadata reads passed verification at import (else guards use the
    correct, slower Python path)."""

def tensor_metadata(t: Any) -> dict[str, Any]:
    """What the tensor leaf reads, for tests: "sizes", "strides", "dtype" (a torch.dtype),
    "device_type", "device_index", "requires_grad", "dispatch_keys" (raw int), "fast" (bool:
    read directly)."""

# ---------------------------------------------------------------------------------------------
# Weak-key dictionaries (rust/weak); the public names are in ferrodyn.weak
# ---------------------------------------------------------------------------------------------

class WeakIdKeyDictionary(MutableMapping[Any, Any]):
    """torch.utils.weak.WeakIdKeyDictionary's behaviour: keys compared by identity (by hash() with
    ref_type=torch.utils.weak._WeakHashRef), held weakly; an entry vanishes when its key dies.
    Registered as a MutableMapping by ferrodyn.weak. Arguments are __init__'s (__new__ ignores them)."""

    def __init__(self, dict: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None = None,
                 ref_type: type | None = None) -> None: ...
    @property
    def ref_type(self) -> type: ...
    def __getitem__(self, key: Any) -> Any: ...
    def __setitem__(self, key: Any, value: Any) -> None: ...
    def __delitem__(self, key: Any) -> None: ...
    def __contains__(self, key: object) -> bool: ...
    def __iter__(self) -> WeakDictIterator: ...
    def __len__(self) -> int: ...
    def keys(self) -> WeakDictIterator: ...  # type: ignore[override]  (one-shot, like torch's generators)
    def values(self) -> WeakDictIterator: ...  # type: ignore[override]
    def items(self) -> WeakDictIterator: ...  # type: ignore[override]
    def keyrefs(self) -> list[Any]: ...
    def copy(self) -> WeakIdKeyDictionary: ...
    def __copy__(self) -> WeakIdKeyDictionary: ...
    def __deepcopy__(self, memo: dict[int, Any]) -> WeakIdKeyDictionary: ...
    def __or__(self, other: Mapping[Any, Any]) -> WeakIdKeyDictionary: ...
    def __ror__(self, other: Mapping[Any, Any]) -> WeakIdKeyDictionary: ...
    def __ior__(self, other: Any) -> WeakIdKeyDictionary: ...
    def __eq__(self, other: object) -> bool: ...

WeakTensorKeyDictionary = WeakIdKeyDictionary

class WeakKeyExactDictionary(WeakIdKeyDictionary):
    """Identity-keyed, weakly held keys, for the converter's object tracking; keys that cannot
    be weakly referenced raise TypeError on insertion; looking them up misses."""

    def __init__(self, dict: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None = None) -> None: ...

class WeakDictIterator(Iterator[Any]):
    """keys()/values()/items(): skips keys that die meanwhile; RuntimeError after an explicit
    insertion or removal during iteration."""

    def __next__(self) -> Any: ...

class _WeakRemover:
    """Internal: what the weakref callback of one dictionary is bound to (the callback is a
    builtin `key_died(wr)` function, rust/ffi/weakkey.rs)."""

class _WeakKeyRef(weakref.ref[Any]):
    """Internal: the weakref a weak dictionary makes for each key (a `weakref.ref` carrying its
    entry's slot); not constructible from Python."""

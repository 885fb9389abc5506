"""Symbolic shapes through torch's own machinery: the one place that makes symbolic fake inputs
and turns a `ShapeEnv`'s guards into Rust expression leaves.

Owns: the bridge from ferrodyn Sources to torch's (`FrameSource`, so a `ShapeEnv` names its
symbols `L['x'].size()[0]`), `TensorPropertySource` (a tensor's size/stride as a graph input),
`fake_input` (a real tensor -> a fake with SymInt sizes at the dims asked for, torch's 0/1
specialisation included; shared by `ferrodyn.compile` and `make_fx(tracing_mode="symbolic")`),
`symint_input` (a Python int -> a SymInt; both kinds of symbol, compile's and make_fx's),
`new_fake_mode` (the FakeTensorMode + ShapeEnv of a compile capture or a make_fx trace),
`ShapeRecord` (what a capture's shape guards are
produced from, kept on the GraphModule's `meta`), `backend_context` (the `TracingContext` a
backend sees, as under torch.compile) and `shape_guard_specs` (`ShapeEnv.produce_guards` ->
`GuardKind.SHAPE` specs in the prefix form of `rust/guards/symexpr.rs`).
Does not own which dims are dynamic (dynamic.py), the SymInt tracker (variables/sym_int.py) or
evaluating guards (Rust).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator

import sympy
import torch
import torch.fx.experimental.symbolic_shapes as _torch_shapes
from torch._guards import GuardSource, Source as TorchSource
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    RelaxedUnspecConstraint,
    ShapeEnv,
    StatefulSymbolicContext,
)

from ferrodyn.guard_spec import GuardKind, GuardSpec
from ferrodyn.source import Source, source_class

META_KEY = "ferrodyn_shape_record"


@dataclasses.dataclass(frozen=True)
class FrameSource(TorchSource):
    """A ferrodyn Source seen by torch's ShapeEnv (which names symbols by `name`)."""

    source: Source

    @property
    def _name_template(self) -> str:
        return self.source.name()

    @property
    def guard_source(self) -> GuardSource:  # type: ignore[override]
        return GuardSource.LOCAL


@source_class
class TensorPropertySource(Source):
    """`base.size()[idx]` / `base.stride()[idx]`: a symbolic dim lifted as a graph input."""

    base: Source
    prop: str  # "size" or "stride"
    idx: int

    def name(self) -> str:
        return f"{self.base.name()}.{self.prop}()[{self.idx}]"

    def root(self) -> Source:
        return self.base.root()


def capture_scalar_outputs() -> bool:
    """torch._dynamo.config.capture_scalar_outputs, honoured by ferrodyn.compile too: `.item()`
    is then an unbacked SymInt/SymFloat in the graph instead of a graph break."""
    return bool(getattr(torch._dynamo.config, "capture_scalar_outputs", False))


def new_shape_env() -> ShapeEnv:
    return ShapeEnv(allow_scalar_outputs=capture_scalar_outputs(),
                    allow_dynamic_output_shape_ops=False)


# The fake mode of each kind of trace: ferrodyn.compile's capture (data-dependent outputs break
# the graph, so its ShapeEnv refuses them) and make_fx's "fake" (static shapes) and "symbolic"
# modes (torch's make_fx settings: unbacked symbols allowed, fallback kernels only when static).
_FAKE_MODES: dict[str, Callable[[], Any]] = {
    "compile": lambda: dict(shape_env=new_shape_env()),
    "fake": lambda: dict(allow_fallback_kernels=True, allow_non_fake_inputs=True,
                         shape_env=ShapeEnv(), static_shapes=True),
    "symbolic": lambda: dict(allow_fallback_kernels=False, allow_non_fake_inputs=True,
                             shape_env=ShapeEnv()),
}


def new_fake_mode(kind: str):
    """A FakeTensorMode over a fresh ShapeEnv for a trace of `kind` (a key of _FAKE_MODES)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(**_FAKE_MODES[kind]())


# ---- symbolic inputs ----------------------------------------------------------------------

def _torch_source(source):
    if source is None or isinstance(source, TorchSource):
        return source
    return FrameSource(source)


def symbolic_context(value: torch.Tensor, source, dynamic_dims, strict_dims=(), duck=()):
    """torch's per-tensor policy: DYNAMIC at `dynamic_dims` (0/1 sizes still specialise, as in
    torch; DUCK at the dims also in `duck` (True: all): equal sizes share a symbol, as under
    torch.compile(dynamic=True) and make_fx), STATIC elsewhere; `strict_dims` (mark_dynamic) may not be specialised:
    producing guards then raises torch's ConstraintViolationError naming the cause."""
    n = value.dim()

    def kind(i):
        if i not in dynamic_dims:
            return DimDynamic.STATIC
        ducked = duck is True or (duck and i in duck)
        return DimDynamic.DUCK if ducked and i not in strict_dims else DimDynamic.DYNAMIC

    return StatefulSymbolicContext(
        dynamic_sizes=[kind(i) for i in range(n)],
        dynamic_strides=[DimDynamic.INFER_STRIDE] * n,
        constraint_sizes=[RelaxedUnspecConstraint(warn_only=False) if i in strict_dims else None
                          for i in range(n)],
        constraint_strides=[None] * n,
        tensor_source=_torch_source(source),
        shape_env_to_source_to_symbol_cache={},
    )


def fake_input(fake_mode, value: torch.Tensor, source, dynamic_dims=(),
               strict_dims=(), duck=(), static_shapes: bool | None = True) -> tuple[Any, Any]:
    """(fake tensor, symbolic context) for a real input; when `dynamic_dims` is empty, static
    (`static_shapes` None: as `fake_mode` decides, torch's make_fx on a user's fake mode) with
    no context. `source`: a ferrodyn Source (compile) or a torch one (make_fx's)."""
    if not dynamic_dims or fake_mode.shape_env is None:
        return fake_mode.from_tensor(value, static_shapes=static_shapes,
                                     source=_torch_source(source)), None
    ctx = symbolic_context(value, source, set(dynamic_dims), set(strict_dims), duck)
    fake = fake_mode.from_tensor(value, source=ctx.tensor_source, symbolic_context=ctx)
    return fake, ctx


def symint_input(shape_env: ShapeEnv, value: int, source, duck: bool = False):
    """A SymInt standing for the Python int `value` read from `source` (a ferrodyn or a torch
    Source). Default (ferrodyn.compile, as torch.compile's ints): an "unspecified" symbol of
    any sign, 0 and 1 not specialised. `duck` (make_fx's symbolic ints, as torch's make_fx):
    a symbol of any sign shared with an equal size, 0 and 1 specialised (a plain int back)."""
    src = _torch_source(source)
    if not duck:
        return shape_env.create_unspecified_symint_and_symbol(value, src, DimDynamic.DYNAMIC)
    return shape_env.create_symintnode(shape_env.create_symbol(value, src, positive=None),
                                       hint=value, source=src)


def is_symbolic(v: Any) -> bool:
    if isinstance(v, torch.SymInt):
        return v.node.maybe_as_int() is None
    if isinstance(v, torch.Tensor):
        return any(is_symbolic(s) for s in (*v.shape, *v.stride()))
    return False


def symbolic_dims(fake: torch.Tensor) -> tuple[int, ...]:
    """Dims whose size or stride is symbolic (left out of the tensor_match leaf)."""
    return tuple(i for i in range(fake.dim())
                 if is_symbolic(fake.shape[i]) or is_symbolic(fake.stride()[i]))


@dataclasses.dataclass
class ShapeRecord:
    """The symbolic inputs of one capture: (fake tensor or SymInt, Source, context), the
    real tensor -> context map for the backend's TracingContext, and the fake mode."""

    fake_mode: Any
    inputs: list[tuple[Any, Source, Any]] = dataclasses.field(default_factory=list)
    contexts: list[tuple[torch.Tensor, Any]] = dataclasses.field(default_factory=list)
    # the dims left out of each input's tensor_match leaf, as decided when it was made (a dim
    # specialised later, `range(s)`, stays out: its shape guard checks it)
    dynamic_dims: dict[Source, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @property
    def shape_env(self) -> ShapeEnv:
        return self.fake_mode.shape_env


def record_of(gm: torch.fx.GraphModule) -> ShapeRecord | None:
    rec = getattr(gm, "meta", {}).get(META_KEY)
    return rec if rec is not None and rec.inputs else None


@contextlib.contextmanager
def backend_context(gm: torch.fx.GraphModule) -> Iterator[None]:
    """Around the backend call of a graph with symbolic inputs: torch's TracingContext with the
    capture's fake mode and each real input's symbolic context, so AOT autograd / Inductor
    re-fakeify the inputs with the same symbols (what torch.compile gives its backends); also
    for a graph with unbacked symbols (`.item()`), whose re-trace needs the capture's ShapeEnv."""
    rec = getattr(gm, "meta", {}).get(META_KEY)
    if rec is None or not rec.inputs and \
            not any("unbacked_bindings" in n.meta for n in gm.graph.nodes):
        yield
        return
    tc = torch._guards.TracingContext(rec.fake_mode)
    for real, ctx in rec.contexts:
        tc.tensor_to_context[real] = ctx
    with torch._guards.tracing(tc):
        yield


# ---- guards ---------------------------------------------------------------------------------

class ShapeGuardUnsupported(ValueError):
    """A ShapeEnv guard that the native expression IR cannot express (floats, true division)."""


_PROPS = {0: "size", 1: "stride", 2: "storage_offset"}  # torch TensorProperty values


def shape_guard_specs(gm: torch.fx.GraphModule) -> list[GuardSpec]:
    """The ShapeEnv's guards of `gm`'s capture as SHAPE specs. Call after the backend compiled
    (backends add guards). Raises torch's ConstraintViolationError when a mark_dynamic dim
    was specialised, ShapeGuardUnsupported for a guard the IR cannot express."""
    rec = getattr(gm, "meta", {}).get(META_KEY)
    if rec is None:
        return []
    pending = [s for s, asserts in rec.shape_env.deferred_runtime_asserts.items() if asserts]
    if pending:  # facts about values read from tensors that only a runtime check could keep
        raise ShapeGuardUnsupported(f"runtime asserts on unbacked symbols {pending}")
    if not rec.inputs:
        return []
    from torch._dynamo.source import TensorPropertySource as TorchTPS

    keys: dict[tuple, str] = {}

    def ref(src) -> str:
        if isinstance(src, TorchTPS) and isinstance(src.base, FrameSource):
            # storage_offset has no index (idx None); the native binding ignores the dim
            key = (src.base.source, _PROPS[src.prop.value], src.idx if src.idx is not None else 0)
        elif isinstance(src, FrameSource):
            key = (src.source, "int", 0)
        else:
            raise ShapeGuardUnsupported(f"a shape guard on {src.name}, which ferrodyn cannot read")
        return keys.setdefault(key, f"__fd_sym{len(keys)}")

    fakes = [f for f, _, _ in rec.inputs]
    sources = [FrameSource(s) for _, s, _ in rec.inputs]
    contexts = [c for _, _, c in rec.inputs]
    _capture.active, _capture.exprs = True, []
    try:  # the printer hands back each sympy expression under a name (see _CapturingPrinter)
        exprs = rec.shape_env.produce_guards_verbose(
            fakes, sources, source_ref=ref, input_contexts=contexts, ignore_static=False,
            langs=("python",))[0].exprs
        captured = list(_capture.exprs)
    finally:
        _capture.active, _capture.exprs = False, []
    by_name = {name: key for key, name in keys.items()}
    pinned = _pinned(rec)
    guards = []
    for text in exprs:
        tokens, used = to_prefix(text, captured)
        bindings = tuple(by_name[n] for n in used)
        if not _redundant(tokens, bindings, pinned):
            guards.append((tokens, bindings))
    return [GuardSpec.make(None, GuardKind.SHAPE, g) for g in _conjunction(guards)]


def _conjunction(guards: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
    """All guards as one leaf: `and:<n>` over shared bindings, so each size is read once per
    check (the leaf explains the first failing conjunct, and lists each in `leaves()`)."""
    if len(guards) <= 1:
        return guards
    keys: list[tuple] = []
    parts = []
    for tokens, bindings in guards:
        remap = {}
        for k, b in enumerate(bindings):
            if b not in keys:
                keys.append(b)
            remap[f"s{k}"] = f"s{keys.index(b)}"
        parts.append(" ".join(remap.get(t, t) for t in tokens.split()))
    return [(f"and:{len(parts)} " + " ".join(parts), tuple(keys))]


def _pinned(rec: ShapeRecord) -> set[tuple]:
    """(source, kind, dim) the tensor_match leaf already checks: static sizes and strides."""
    out = set()
    for fake, src, _ in rec.inputs:
        if isinstance(fake, torch.Tensor):
            dyn = set(rec.dynamic_dims[src])
            for i in range(fake.dim()):
                if i not in dyn:
                    out.add((src, "size", i))
                    out.add((src, "stride", i))
    return out


def _redundant(tokens: str, bindings: tuple, pinned: set) -> bool:
    """`pinned == constant` (tensor_match checks it) and `storage_offset == constant` (a static
    tensor's storage offset is not guarded either)."""
    parts = tokens.split()
    if len(parts) == 3 and parts[0] == "eq" and len(bindings) == 1 and \
            "s0" in parts[1:] and any(p.lstrip("-").isdigit() for p in parts[1:]):
        b = bindings[0]
        return b in pinned or b[1] == "storage_offset"
    return False


# ---- Python expression text -> prefix tokens ----------------------------------------------

_BINOPS = {ast.Add: "add:2", ast.Mult: "mul:2", ast.FloorDiv: "floordiv", ast.Mod: "mod",
           ast.Pow: "pow"}
_CMPOPS = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt",
           ast.GtE: "ge"}
_CALLS = {"torch.sym_max": "max", "torch.sym_min": "min", "max": "max", "min": "min",
          "sym_max": "max", "sym_min": "min"}


# ---- sympy -> prefix tokens ------------------------------------------------------------------
#
# torch's ShapeEnv prints its guards to Python text, and that printer is not a faithful
# inverse (`-Mod(a, 2)` prints as `(-1)*a % 2`, which Python reads as `((-1)*a) % 2`). So the
# expressions are taken as sympy objects instead: while `shape_guard_specs` runs, the guard
# printer (a subclass installed in torch's module, inert on every other call and thread)
# returns a placeholder name `__fd_expr<j>` for each sympy expression and records it; the
# printed text then only glues placeholders and sources together (`<source> == <expr>`), and
# every expression is converted from sympy by `_emit_sympy`.

_capture = threading.local()
_EXPR_PREFIX = "__fd_expr"


class _CapturingPrinter(_torch_shapes.ShapeGuardPythonPrinter):
    def doprint(self, expr, *args, **kwargs):  # type: ignore[override]
        if not getattr(_capture, "active", False):
            return super().doprint(expr, *args, **kwargs)
        _capture.exprs.append((expr, self))
        return f"{_EXPR_PREFIX}{len(_capture.exprs) - 1}"


if not issubclass(_torch_shapes.ShapeGuardPythonPrinter, _CapturingPrinter):
    _torch_shapes.ShapeGuardPythonPrinter = _CapturingPrinter  # type: ignore[misc]


def _sympy_ops():
    from torch.utils._sympy import functions as F
    table: list[tuple[tuple[type, ...], str, bool]] = [  # (types, op, n-ary)
        ((sympy.Add,), "add", True), ((sympy.Mul,), "mul", True),
        ((F.Max, sympy.Max), "max", True), ((F.Min, sympy.Min), "min", True),
        ((sympy.And,), "and", True), ((sympy.Or,), "or", True),
        ((F.FloorDiv,), "floordiv", False),  # CleanDiv is a FloorDiv
        ((F.PythonMod, F.Mod, sympy.Mod), "mod", False),  # torch's Mod: nonnegative operands
        ((F.PowByNatural,), "pow", False),
        ((sympy.Eq,), "eq", False), ((sympy.Ne,), "ne", False),
        ((sympy.StrictLessThan,), "lt", False), ((sympy.LessThan,), "le", False),
        ((sympy.StrictGreaterThan,), "gt", False), ((sympy.GreaterThan,), "ge", False),
        ((sympy.Not,), "not", False),
    ]
    return table


_SYMPY_OPS: list | None = None


# |numerator| below 2**52: there `ceil(a / b)` / `floor(a / b)` in floats (what the guard means:
# Python's `math.ceil(a / b)`) equals the exact integer ceil/floor division, which the native
# IR computes; larger numerators fail the guard (a cache miss, never a wrong hit).
_EXACT_DIV_BOUND = 2 ** 52


def _emit_rounded_div(e, out: list[str], sym, side: list[str] | None) -> bool:
    """CeilToInt/FloorToInt(IntTrueDiv(a, b)) (`math.ceil(s / 2)`) as exact integer division,
    with the numerator's bound appended to `side` (conjoined with the whole guard)."""
    from torch.utils._sympy import functions as F
    if not isinstance(e, (F.CeilToInt, F.FloorToInt)) or \
            not isinstance(e.args[0], F.IntTrueDiv) or side is None:
        return False
    num: list[str] = []
    den: list[str] = []
    _emit_sympy(e.args[0].args[0], num, sym, side)
    _emit_sympy(e.args[0].args[1], den, sym, side)
    n, d = " ".join(num), " ".join(den)
    side.append(f"lt {n} {_EXACT_DIV_BOUND}")
    side.append(f"gt {n} {-_EXACT_DIV_BOUND}")
    if isinstance(e, F.CeilToInt):  # ceil(a / b) == -((-a) // b)
        out.extend(["neg", "floordiv", "neg", n, d])
    else:
        out.extend(["floordiv", n, d])
    return True


def _with_side(tokens: str, side: list[str]) -> str:
    return tokens if not side else f"and:{1 + len(side)} {tokens} " + " ".join(side)


def _emit_sympy(e, out: list[str], sym: Callable[[Any], str], side: list[str] | None = None) -> None:
    global _SYMPY_OPS
    if _emit_rounded_div(e, out, sym, side):
        return
    if e is sympy.true or e is sympy.false:
        out.append("true" if e is sympy.true else "false")
        return
    if getattr(e, "is_Integer", False):
        out.append(str(int(e)))
        return
    if isinstance(e, sympy.Symbol):
        out.append(sym(e))
        return
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        out.append("pow")
        _emit_sympy(e.base, out, sym, side)
        out.append(str(int(e.exp)))
        return
    if _SYMPY_OPS is None:
        _SYMPY_OPS = _sympy_ops()
    for types, op, nary in _SYMPY_OPS:
        if isinstance(e, types):
            if not nary and op != "not" and len(e.args) != 2:
                break
            out.append(f"{op}:{len(e.args)}" if nary else op)
            for a in e.args:
                _emit_sympy(a, out, sym, side)
            return
    raise ShapeGuardUnsupported(f"shape guard term {e} ({type(e).__name__}) has no native form")


def sympy_to_prefix(expr, name_of: Callable[[Any], str] = str) -> tuple[str, list[str]]:
    """A sympy guard expression -> (prefix tokens, symbol names in order of `s<k>`)."""
    names: list[str] = []
    out: list[str] = []

    def sym(s) -> str:
        n = name_of(s)
        if n not in names:
            names.append(n)
        return f"s{names.index(n)}"

    side: list[str] = []
    _emit_sympy(expr, out, sym, side)
    return _with_side(" ".join(out), side), names


def to_prefix(text: str, captured=()) -> tuple[str, list[str]]:
    """A guard as printed by torch (symbols as identifiers; `__fd_expr<j>` stands for the j-th
    `captured` (sympy expression, printer)) -> (prefix tokens with `s<k>` for the k-th symbol
    identifier in order of appearance, the identifiers)."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise ShapeGuardUnsupported(f"cannot parse shape guard {text!r}: {e}") from e
    names: list[str] = []
    out: list[str] = []
    side: list[str] = []

    def sym_token(name: str) -> str:
        if name not in names:
            names.append(name)
        return f"s{names.index(name)}"

    def emit(node) -> None:
        if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
            out.append(("true" if node.value else "false") if type(node.value) is bool
                       else str(node.value))
        elif isinstance(node, ast.Name) and node.id.startswith(_EXPR_PREFIX):
            expr, printer = captured[int(node.id[len(_EXPR_PREFIX):])]
            _emit_sympy(expr, out, lambda s: sym_token(printer._print_Symbol(s)), side)
        elif isinstance(node, ast.Name):
            out.append(sym_token(node.id))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            out.append(_BINOPS[type(node.op)])
            emit(node.left)
            emit(node.right)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            out.append("add:2")
            emit(node.left)
            out.append("neg")
            emit(node.right)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not, ast.UAdd)):
            if not isinstance(node.op, ast.UAdd):
                out.append("neg" if isinstance(node.op, ast.USub) else "not")
            emit(node.operand)
        elif isinstance(node, ast.BoolOp):
            out.append(f"{'and' if isinstance(node.op, ast.And) else 'or'}:{len(node.values)}")
            for v in node.values:
                emit(v)
        elif isinstance(node, ast.Compare):
            ops, items = node.ops, [node.left, *node.comparators]
            if any(type(o) not in _CMPOPS for o in ops):
                raise ShapeGuardUnsupported(f"comparison in shape guard {text!r}")
            if len(ops) > 1:
                out.append(f"and:{len(ops)}")
            for op, a, b in zip(ops, items, items[1:]):
                out.append(_CMPOPS[type(op)])
                emit(a)
                emit(b)
        elif isinstance(node, ast.Call) and not node.keywords and \
                ast.unparse(node.func) in _CALLS and len(node.args) >= 2:
            out.append(f"{_CALLS[ast.unparse(node.func)]}:{len(node.args)}")
            for a in node.args:
                emit(a)
        else:
            raise ShapeGuardUnsupported(
                f"shape guard {text!r}: {ast.unparse(node)!r} has no native form")

    emit(tree)
    return _with_side(" ".join(out), side), names

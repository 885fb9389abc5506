"""ferrodyn in one page: frame -> bytecode -> graph -> guards, and back again.

A literate walkthrough in the spirit of JAX's autodidax: read it top to bottom, or run it

    PYTHONPATH=python .venv/bin/python docs/walkthrough.py

Every step asserts what it shows, so this file is also a test (tests/test_walkthrough.py runs
it). It uses only ferrodyn's public API (`ferrodyn.compile`, `explain`, `make_fx`, `weak`) and
the documented internals each part owns: `ferrodyn._C` (the Rust core, contract in `_C.pyi`),
`ferrodyn.symbolic.trace_frame` (the converter), `ferrodyn.codegen`, `ferrodyn.guards`.

The loop, in one picture (DESIGN.md has the long version):

    f(x, w)  ──►  CPython makes a frame  ──►  Rust hook (PEP 523)
                                               ├─ cache entry whose guards pass? ──► run its entry
                                               └─ miss ──► Python callback(FrameView)
                                                      trace bytecode ──► fx graph + guard specs
                                                      backend(graph) ──► compiled graph
                                                      guard specs   ──► Rust GuardTree
                                                      codegen       ──► entry function
                                                 ◄── CacheEntry(entry, guards): stored and run

We will take that loop apart, run each piece by hand, put it back together in a dozen lines,
and then watch `ferrodyn.compile` do the same thing.
"""

import dis

import torch

import ferrodyn
from ferrodyn import _C


def say(*lines):
    """Narration for readers who run the file."""
    for line in lines:
        print(line)


def section(title):
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


# ---------------------------------------------------------------------------------------------
# 0. The program
# ---------------------------------------------------------------------------------------------
# A small layer with three kinds of inputs the tracer treats differently: tensors (become graph
# inputs), a Python bool (specialised: the `if` is decided while tracing) and a global float
# (read from the frame's globals, baked into the graph as a constant).

SCALE = 2.0


def layer(x, w, bias=True):
    y = torch.relu(x @ w) * SCALE
    if bias:
        y = y + 1
    return {"out": y, "rows": x.shape[0]}


x = torch.randn(3, 4)
w = torch.randn(4, 2)
expected = layer(x, w)

# ---------------------------------------------------------------------------------------------
# 1. The frame hook
# ---------------------------------------------------------------------------------------------
# CPython lets an extension replace the function that evaluates frames (PEP 523). ferrodyn's Rust
# hook is installed while some thread has a *callback*; the callback is per thread. On a cache
# miss the hook calls it with a `FrameView`: the code, globals, builtins, the argument slots and
# the closure cells -- no frame object is created. Returning None runs the frame normally.

section("1. the frame hook")
seen = []


def recording_callback(frame):
    seen.append(frame)
    return None  # None: "I have no entry for this frame, run it as usual"


prior = _C.set_eval_frame(recording_callback)
try:
    result = layer(x, w)
finally:
    _C.set_eval_frame(prior)

assert _C.get_eval_frame() is prior is None
frame = next(f for f in seen if f.f_code is layer.__code__)
assert frame.args[0] is x and frame.args[1] is w and frame.args[2] is True  # default applied
assert list(frame.f_locals) == ["x", "w", "bias"]
assert frame.f_globals is globals() and frame.closure is None
assert torch.equal(result["out"], expected["out"])
say(f"the callback saw {[f.f_code.co_name for f in seen]}; layer's argument slots: "
    f"{[type(a).__name__ for a in frame.args]}")

# ---------------------------------------------------------------------------------------------
# 2. Bytecode -> graph: the symbolic converter
# ---------------------------------------------------------------------------------------------
# `trace_frame` runs layer's bytecode over *variable trackers* instead of values. Each argument
# becomes a lazy tracker that remembers its Source (`L['x']`: argument slot x). Tensor operations
# are recorded as nodes of a torch.fx graph (with fake tensors as example values); Python values
# are used as constants, and every value the trace depended on leaves a guard *spec* behind.
# Each opcode has one handler, registered by name for the Python versions it covers.

section("2. bytecode -> graph")
from ferrodyn.symbolic import registry, trace_frame  # noqa: E402
from ferrodyn.source import LocalSource  # noqa: E402
from ferrodyn.trace_result import OutConst, OutDict, OutGraph  # noqa: E402

opnames = [i.opname for i in dis.get_instructions(layer)]
assert all(registry.handler_for(op) is not None for op in opnames), opnames
say(f"layer is {len(opnames)} instructions: {' '.join(dict.fromkeys(opnames))}")

traced = trace_frame(frame.f_code, frame.f_globals, frame.f_builtins, frame.args, frame.closure)
gm = traced.graph
say("the graph:", gm.code.strip())

# The graph holds exactly the tensor work; `if bias` and SCALE are gone (decided / inlined).
targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
assert torch.relu in targets and len([n for n in gm.graph.nodes if n.op == "placeholder"]) == 2
assert not any(n.op == "call_function" and n.target is bool for n in gm.graph.nodes)

# Where each graph input comes from: argument slots x and w.
assert traced.graph_inputs == [LocalSource(0, "x"), LocalSource(1, "w")]
assert [s.name() for s in traced.graph_inputs] == ["L['x']", "L['w']"]
assert [t is a for t, a in zip(traced.example_inputs, (x, w))] == [True, True]

# How to rebuild the return value: a dict whose "out" is graph output 0 and whose "rows" is the
# constant 3 (x.shape[0] is static, so it is known at trace time -- and guarded, see step 4).
assert traced.output == OutDict(keys=("out", "rows"), values=(OutGraph(0), OutConst(3)))

# What the trace depended on, as (source, kind) specs: the tensors' metadata, the bool, the
# global float, and the `torch` module the code looked up.
specs = {g.describe() for g in traced.guards}
say("guard specs:", *sorted(f"  {s}" for s in specs))
assert {"TENSOR_MATCH(L['x'])", "TENSOR_MATCH(L['w'])", "EQUALS(L['bias'])",
        "EQUALS(G['SCALE'])", "ID_MATCH(G['torch'])"} <= specs

# The graph alone computes "out".
assert torch.allclose(gm(x, w)[0], expected["out"])

# ---------------------------------------------------------------------------------------------
# 3. The entry function
# ---------------------------------------------------------------------------------------------
# On a cache hit the Rust hook does not run layer's bytecode: it calls an *entry function* with
# the frame's argument slots. The frontend assembles its bytecode from the TraceResult: load the
# graph inputs, call the compiled graph (with tracing fenced off inside it by a try/finally),
# rebuild the output. The listing below is that bytecode.

section("3. the entry function")
from ferrodyn import codegen  # noqa: E402

entry_fn = codegen.generate_entry(layer.__code__, traced, gm.forward, frame.f_globals, frame.f_builtins)
say(entry_fn.__ferrodyn_source__)
assert entry_fn.__code__.co_varnames[:3] == ("x", "w", "bias")  # called with the argument slots
assert "__ferrodyn_graph" in entry_fn.__ferrodyn_source__
assert entry_fn.__name__ == "layer"  # tracebacks read like the user's function
assert _C.code_flags(entry_fn.__code__) == "skip"  # the hook never intercepts an entry
out = entry_fn(x, w, True)
assert out.keys() == expected.keys() and out["rows"] == 3
assert torch.allclose(out["out"], expected["out"])

# ---------------------------------------------------------------------------------------------
# 4. Guards: specs -> a Rust guard tree
# ---------------------------------------------------------------------------------------------
# An entry is only valid for inputs like the ones it was traced with. The specs compile into a
# tree of accessors (argument slot, global, attribute, item, ...) with leaf checks, evaluated in
# Rust, cheap leaves first. Each leaf knows its source expression, so a failure explains itself
# -- lazily: explaining costs nothing while guards pass.

section("4. guards")
from ferrodyn import guards  # noqa: E402
from ferrodyn.guard_spec import GuardKind, GuardSpec  # noqa: E402

tree = guards.compile_guards([*traced.guards, GuardSpec.make(None, GuardKind.GLOBAL_STATE)],
                             frame.f_globals, frame.f_builtins)
say("leaves, in evaluation order:", *(f"  {leaf}" for leaf in tree.leaves()))
assert len(tree) == len(tree.leaves()) >= 6
assert tree.leaves().index("type(L['bias']) is bool") < tree.leaves().index("L['bias'] == True")
assert tree.leaves()[-1].startswith("tensor_match(")  # tensor checks last: the most expensive

g, b = frame.f_globals, frame.f_builtins
assert tree.check((torch.randn(3, 4), torch.randn(4, 2), True), g, b)  # other values, same kind
assert tree.explain((x, w, True), g, b) is None
why_shape = tree.explain((torch.randn(5, 4), w, True), g, b)
why_bias = tree.explain((x, w, False), g, b)
why_dtype = tree.explain((x.double(), w, True), g, b)
say(f"a 5x4 x:     {why_shape}", f"bias=False:  {why_bias}", f"float64 x:   {why_dtype}")
assert why_shape == "L['x'].size()[0] == 3 (got 5)"
assert why_bias.startswith("L['bias'] == True")
assert why_dtype is not None and "L['x']" in why_dtype
assert not tree.check((x, w, True), {**g, "SCALE": 3.0}, b)  # a changed global fails too
assert "G['SCALE'] == 2.0" in tree.explain((x, w, True), {**g, "SCALE": 3.0}, b)

# ---------------------------------------------------------------------------------------------
# 5. The loop, assembled by hand
# ---------------------------------------------------------------------------------------------
# Steps 1-4 are the whole mechanism. Here they are again as a frame callback: trace, "compile"
# with a backend (here: call the graph as is), build guards, generate the entry, return a
# CacheEntry. The hook inserts it into layer's cache and runs it; the next call with inputs
# that pass the guards is a hit in Rust, without calling back into Python.

section("5. the loop, by hand")
traced_calls = []


def tiny_callback(frame):
    if frame.f_code is not layer.__code__:
        return None  # only layer, in this demo (any other frame runs normally)
    traced_calls.append(frame)
    result = trace_frame(frame.f_code, frame.f_globals, frame.f_builtins, frame.args, frame.closure)
    compiled_graph = result.graph.forward  # the "eager" backend
    tree = guards.compile_guards([*result.guards, GuardSpec.make(None, GuardKind.GLOBAL_STATE)],
                                 frame.f_globals, frame.f_builtins)
    fn = codegen.generate_entry(frame.f_code, result, compiled_graph, frame.f_globals, frame.f_builtins)
    return _C.CacheEntry(fn, tree, compile_id="walkthrough/0")


_C.reset()
prior = _C.set_eval_frame(tiny_callback)
try:
    first = layer(x, w)     # miss: the callback traces, the hook stores and runs the entry
    second = layer(x, w)    # hit: guards pass in Rust, the entry runs
finally:
    _C.set_eval_frame(prior)
stats = _C.cache_stats()
say(f"cache stats: {stats}")
# One trace, one hit. ("misses" counts every callback call, including frames it declined.)
assert len(traced_calls) == 1 and (stats["hits"], stats["entries"]) == (1, 1)
[entry] = _C.cache_entries(layer.__code__)
assert entry.compile_id == "walkthrough/0" and entry.hits == 1
assert entry.guards.leaves() == tree.leaves()
assert torch.allclose(first["out"], expected["out"]) and torch.allclose(second["out"], expected["out"])
_C.reset()
assert _C.cache_entries(layer.__code__) == []

# ---------------------------------------------------------------------------------------------
# 6. ferrodyn.compile does the same
# ---------------------------------------------------------------------------------------------
# The public API wraps exactly this loop (convert_frame.FrameCallback adds skip rules, error
# handling, the cache limit and logging). A backend is any torch.compile backend:
# `(gm, example_inputs) -> callable`. This one counts the graphs it is given.

section("6. ferrodyn.compile")


class CountingBackend:
    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


ferrodyn.reset()
backend = CountingBackend()
compiled = ferrodyn.compile(layer, backend=backend)
for _ in range(3):
    out = compiled(x, w)
    assert torch.allclose(out["out"], expected["out"]) and out["rows"] == 3
stats = _C.cache_stats()
say(f"3 calls: {len(backend.graphs)} graph, cache stats {stats}")
# "misses" counts every callback call. Besides layer's first frame, the graph's own fx forward
# was seen once: the callback marked its code SKIP (torch-generated code is never traced).
assert len(backend.graphs) == 1
assert stats["hits"] == 2 and stats["entries"] == 1
assert _C.code_flags(backend.graphs[0].forward.__code__) == "skip"
[entry] = _C.cache_entries(layer.__code__)
assert entry.hits == 2 and "tensor_match(L['x']" in " ".join(entry.guards.leaves())
assert _C.get_eval_frame() is None  # the callback is installed only during a compiled call

# ---------------------------------------------------------------------------------------------
# 7. Recompiles
# ---------------------------------------------------------------------------------------------
# A call whose inputs fail every entry's guards is a miss: the frame is traced again and a second
# entry joins the cache (most recently hit first). Past `ferrodyn.config.cache_size_limit`
# entries, the frame just runs eagerly. `ferrodyn.explain` reports graphs, guards and why.
# A recompile caused by a changed size also makes that dim symbolic for this code object
# (automatic dynamic, as torch.compile): the second entry serves every row count >= 2.

section("7. recompiles")
x5 = torch.randn(5, 4)
out = compiled(x5, w)
assert torch.allclose(out["out"], layer(x5, w)["out"]) and out["rows"] == 5
assert len(backend.graphs) == 2
entries = _C.cache_entries(layer.__code__)
assert len(entries) == 2 and entries[0].hits == 0 and entries[1].hits == 2
assert entries[1].guards.explain((x5, w, True), g, b) == "L['x'].size()[0] == 3 (got 5)"

compiled(x5, w, bias=False)  # a different bool: a third graph, without the `+ 1`
assert len(backend.graphs) == 3
assert len([n for n in backend.graphs[2].graph.nodes if n.op == "call_function"]) == \
    len([n for n in backend.graphs[1].graph.nodes if n.op == "call_function"]) - 1
compiled(x, w)  # 3 rows: served by the symbolic entry, no new graph
assert len(backend.graphs) == 3
assert "2 <= L['x'].size()[0]" in _C.cache_entries(layer.__code__)[0].guards.leaves()

report = ferrodyn.explain(layer)(x, w)
say(*str(report).splitlines()[:4])
assert report.graph_count == 1 and report.graph_break_count == 0
assert any("L['bias'] == True" in guard for guard in report.guards)

# Not every frame can be captured whole. Code the converter cannot model (here: a branch on
# tensor data) breaks the graph: the graph so far is compiled, the branch runs eagerly, and each
# side continues in a resume function (a code object built from the original bytecode) that is
# captured as a frame of its own -- never a wrong result. With fullgraph=True it raises
# ferrodyn.Unsupported naming the construct and the line, catchable as torch.compile's own.


def data_dependent(x):
    if x.sum() > 0:  # the branch depends on tensor data
        return x + 1
    return x - 1


try:
    ferrodyn.compile(data_dependent, backend=backend, fullgraph=True)(x)
    raise AssertionError("expected Unsupported")
except ferrodyn.Unsupported as e:
    assert isinstance(e, torch._dynamo.exc.Unsupported)
    say(f"fullgraph=True: {str(e).splitlines()[0]}")
ferrodyn.reset()
n_graphs = len(backend.graphs)
assert torch.equal(ferrodyn.compile(data_dependent, backend=backend)(x), data_dependent(x))
assert len(backend.graphs) == n_graphs + 2  # x.sum() before the branch, x + 1 after it

# ---------------------------------------------------------------------------------------------
# 8. make_fx: from torch-level graphs to aten
# ---------------------------------------------------------------------------------------------
# The captured graph calls torch functions (torch.relu, @). A backend that wants the primitive
# operations lowers it with `ferrodyn.make_fx`: it runs the graph under a dispatch mode that
# records every aten op reaching the dispatcher. In "fake" mode nothing is computed.

section("8. make_fx")
aten_gm = ferrodyn.make_fx(gm, tracing_mode="fake")(x, w)
aten_ops = [n.target for n in aten_gm.graph.nodes if n.op == "call_function"]
say("aten graph:", aten_gm.code.strip())
assert all(isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" for op in aten_ops)
assert torch.ops.aten.relu.default in aten_ops
assert torch.allclose(aten_gm(x, w)[0], expected["out"])

# The "aten_eager" backend is exactly that lowering, usable by ferrodyn.compile.
ferrodyn.reset()
out = ferrodyn.compile(layer, backend="aten_eager")(x, w)
assert torch.allclose(out["out"], expected["out"])
ferrodyn.reset()

# ---------------------------------------------------------------------------------------------
# 9. The weak dictionaries
# ---------------------------------------------------------------------------------------------
# make_fx maps each live tensor to the graph node that produced it. Keys must be compared by
# identity (tensor == is elementwise) and held weakly (a trace must not keep its intermediates
# alive). torch.utils.weak has such dictionaries in Python; ferrodyn's are in Rust, same
# behaviour.

section("9. weak dictionaries")
from ferrodyn.proxy_dispatch import last_trace  # noqa: E402
from ferrodyn.weak import WeakTensorKeyDictionary  # noqa: E402

d = WeakTensorKeyDictionary()
a, a_twin = torch.ones(2), torch.ones(2)
d[a] = "node_a"
assert a in d and a_twin not in d  # identity, not equality
del a
assert len(d) == 0  # the entry died with its key

tracker = last_trace["tracker"]  # the tracker of the make_fx trace of step 8
assert isinstance(tracker.tensors, WeakTensorKeyDictionary) and len(tracker.tensors) == 0
say("make_fx's tensor -> node map is empty after the trace: nothing was kept alive")

section("done")
say("frame -> bytecode -> graph -> guards -> entry -> cache hit: every step checked.")

"""Guard evaluation in isolation: torch.compile's guard manager against ferrodyn's GuardTree with
the equivalent checks, on the same f_locals dict. Owns only this comparison (group "guards").

Cases: functions of 1, 4, 16 and 64 tensor arguments (tensor_match per tensor + global state),
and an 8-layer MLP nn.Module whose parameters are guarded (type of self, parameters reached via
`dict_of(self) -> item('_modules') -> ...` / `item('_parameters') -> item(name)` with
tensor_match), both as that hand-built tree and as the tree of ferrodyn's own compiled entry
(76 leaves on 94 accessors; each Linear's four empty hook dicts are one leaf on its
`__dict__`, torch's four global ones one leaf per graph: `rust/guards/dicts_empty.rs`). A
derived row gives the per-tensor-leaf cost (slope between 16 and 64 args). Trees like these are decided by the replay path (`rust/guards/replay.rs`) once they
have seen the module: dict lookups proven current by dict/type version tags, accessors shared
between nodes on the same object read once, plain tensor leaves compared from packed copies,
and the `type(m).forward...` chains of the 2nd..8th Linear (same class as the 1st, proven by
their `type(m) is Linear` leaves) not walked at all.
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from timing import interleaved_ns  # noqa: E402
from workloads import MLP  # noqa: E402

from ferrodyn import _C  # noqa: E402

GROUP = "guards"


def _make_fn(n: int):
    names = [f"a{i}" for i in range(n)]
    src = f"def f({', '.join(names)}):\n    return ({' + '.join(names)}) * 2\n"
    ns: dict = {}
    exec(compile(src, f"<guards bench {n}>", "exec"), ns)
    return ns["f"], names


def _torch_guard(fn, f_locals_args, code):
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager", dynamic=False)
    compiled(*f_locals_args)
    entries = _debug_get_cache_entry_list(code)
    return entries[0].guard_manager


def _tensor_case(n: int):
    fn, names = _make_fn(n)
    args = [torch.randn(4, 8) for _ in range(n)]
    gm = _torch_guard(fn, args, fn.__code__)
    # Keys as a frame's f_locals has them: the code's own (interned) variable names.
    f_locals = dict(zip(fn.__code__.co_varnames, args))
    b = _C.GuardBuilder(fn.__globals__)
    for i, (name, t) in enumerate(zip(names, args)):
        b.tensor_match(b.local(i, name), t)
    b.global_state()
    tree = b.build()
    assert gm.check(f_locals) and tree.check(f_locals) and tree.check(tuple(args))
    return gm, tree, f_locals, tuple(args)



def _mlp_case():
    m = MLP(width=32)
    x = torch.randn(2, 32)
    torch._dynamo.reset()
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    cm = torch.compile(m, backend="eager", dynamic=False)
    cm(x)
    gm = _debug_get_cache_entry_list(MLP.forward.__code__)[0].guard_manager
    f_locals = dict(zip(MLP.forward.__code__.co_varnames, (m, x)))
    b = _C.GuardBuilder(MLP.forward.__globals__)
    self_ = b.local(0, "self")
    b.type_is(self_, MLP)
    b.tensor_match(b.local(1, "x"), x)
    layers = b.item(b.item(b.dict_of(self_), "_modules"), "layers")
    b.type_is(layers, torch.nn.ModuleList)
    mods = b.item(b.dict_of(layers), "_modules")
    for i, lin in enumerate(m.layers):
        ln = b.item(mods, str(i))
        b.type_is(ln, torch.nn.Linear)
        params = b.item(b.dict_of(ln), "_parameters")
        b.tensor_match(b.item(params, "weight"), lin.weight)
        b.tensor_match(b.item(params, "bias"), lin.bias)
    b.global_state()
    tree = b.build()
    assert gm.check(f_locals) and tree.check(f_locals) and tree.check((m, x))
    return gm, tree, f_locals, (m, x)


def _mlp_entry_case():
    """The same MLP, with the guard tree of ferrodyn's own compiled entry (what a cache hit runs:
    hook and hook-dict lengths, types' `forward`, globals, parameters as exported inputs)."""
    import ferrodyn

    gm, _, f_locals, slots = _mlp_case()
    m, x = slots
    ferrodyn.reset()
    opt = ferrodyn.compile(m, backend="eager")
    opt(x)
    opt(x)  # a hit: the tree has now seen the module
    (entry,) = _C.cache_entries(MLP.forward.__code__)
    tree = entry.guards
    assert tree.check(f_locals, MLP.forward.__globals__) and tree.check(slots, MLP.forward.__globals__)
    return gm, tree, f_locals, slots


def run(rounds: int = 200) -> list[dict]:
    rows = []
    per = {}
    cases = [(f"{n} tensor args", lambda n=n: _tensor_case(n)) for n in (1, 4, 16, 64)]
    cases.append(("8-layer MLP module (16 params)", _mlp_case))
    cases.append(("8-layer MLP module, compiled entry's own tree", _mlp_entry_case))
    ref = "torch guard_manager.check"
    for name, make in cases:
        gm, tree, f_locals, slots = make()
        t = interleaved_ns({"torch": lambda: gm.check(f_locals), "ferrodyn": lambda: tree.check(f_locals),
                            "slots": lambda: tree.check(slots)}, inner=200, rounds=rounds)
        per[name] = t
        rows.append({"case": name, "ferrodyn": t["ferrodyn"], "reference": t["torch"], "unit": "ns",
                     "reference_name": ref})
    a, b = per["16 tensor args"], per["64 tensor args"]
    slope = {k: (b[k] - a[k]) / 48 for k in a}
    rows.append({"case": "per tensor leaf (slope 16->64)", "ferrodyn": slope["ferrodyn"],
                 "reference": slope["torch"], "unit": "ns", "reference_name": ref})
    # The hook checks a frame's argument slots (no dict lookups): same trees, tuple input.
    for name in ("1 tensor args", "64 tensor args"):
        rows.append({"case": f"{name}, slots", "ferrodyn": per[name]["slots"], "reference": per[name]["torch"],
                     "unit": "ns", "reference_name": ref})
    rows.append({"case": "per tensor leaf (slope 16->64), slots", "ferrodyn": slope["slots"],
                 "reference": slope["torch"], "unit": "ns", "reference_name": ref})
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)

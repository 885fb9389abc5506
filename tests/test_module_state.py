"""nn.Module state changed inside the compiled frame (variables/nn_module_state.py):
`register_buffer`, `add_module`, `ModuleList.append/extend/insert`, `ModuleDict[k] = m`, writes
into `_buffers`. torch's own code runs inlined and writes into the module's dicts through their
dict trackers (replayed after the graph, the dicts keep their identity); later reads in the same
frame see the new state; the next call's guards see the changed dicts. Each case: compiled vs
eager (results and the module's state after every call: named buffers, parameters, modules,
training flags) and graph counts against torch.compile's in the same test."""

import pytest
import torch
import torch.nn as nn

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def module_state(m: nn.Module) -> dict:
    """What eager and compiled runs must leave equal (values cloned, modules by type)."""
    return {
        "buffers": {k: v.detach().clone() for k, v in m.named_buffers()},
        "params": {k: (v.detach().clone(), v.dtype, v.device) for k, v in m.named_parameters()},
        "modules": [(k, type(v).__name__) for k, v in m.named_modules()],
        "training": [s.training for s in m.modules()],
        "non_persistent": sorted(m._non_persistent_buffers_set),
        "attrs": sorted(k for k in vars(m) if not k.startswith("_")),
    }


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, nn.Module):  # one per run: compared by type (identity by `check`)
        return type(a) is type(b)
    return a == b


def three_ways(make, args, calls=3, check=None):
    """Run `fn` of `make()` (a fresh (module, fn) each mode) eager, with ferrodyn and with
    torch.compile; assert ferrodyn == eager (results, module state after every call, and
    `check(module, results)`), and ferrodyn's graph count == torch.compile's."""
    out = {}
    for mode in ("eager", "ferrodyn", "torch"):
        torch.manual_seed(0)
        m, fn = make()
        cb = CountingBackend()
        if mode == "ferrodyn":
            ferrodyn.reset()
            fn = ferrodyn.compile(fn, backend=cb)
        elif mode == "torch":
            torch._dynamo.reset()
            fn = torch.compile(fn, backend=cb)
        trace = []
        for _ in range(calls):
            r = fn(*args)
            trace.append((r, module_state(m), check(m, r) if check else None))
        out[mode] = (trace, cb.count)
    torch._dynamo.reset()
    for i, (want, got) in enumerate(zip(out["eager"][0], out["ferrodyn"][0])):
        assert same(got, want), f"call {i}: ferrodyn {got} != eager {want}"
    assert out["ferrodyn"][1] == out["torch"][1], \
        f"graphs: ferrodyn {out['ferrodyn'][1]}, torch.compile {out['torch'][1]}"
    return out


def test_register_buffer_in_forward_once():
    """Registered on the first call (the replay), found on the next (its key set recompiles)."""
    class M(nn.Module):
        def forward(self, x):
            if not hasattr(self, "cache"):
                self.register_buffer("cache", x * 2, persistent=False)
            return x + self.cache

    def make():
        m = M()
        return m, m
    out = three_ways(make, (torch.randn(4),))
    assert out["ferrodyn"][1] == 2


def test_register_buffer_seen_by_later_reads_in_the_frame():
    """named_buffers / buffers / attribute reads after the registration see it (pending)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", torch.ones(3))

        def forward(self, x):
            self.register_buffer("b", x.sin())
            names = [k for k, _ in self.named_buffers()]
            return sum(self.buffers()) + self.b, names, len(self._buffers)

    def make():
        m = M()
        return m, m
    three_ways(make, (torch.randn(3),))


def test_write_into_buffers_dict_is_replayed():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("step", torch.zeros(()))

        def forward(self, x):
            self._buffers["step"] = self.step + 1
            return x * self.step

    def make():
        m = M()
        return m, m
    three_ways(make, (torch.randn(3),))


def test_add_module_in_forward():
    """A torch.nn module built in the frame is stored (the entry builds it again per call)."""
    class M(nn.Module):
        def forward(self, x):
            if "act" not in self._modules:
                self.add_module("act", nn.ReLU())
            return self.act(x)

    def make():
        m = M()
        return m, m
    out = three_ways(make, (torch.randn(4),))
    assert out["ferrodyn"][1] == 2


def test_modulelist_append_extend_insert():
    ml = None

    def make():
        nonlocal ml
        ml = nn.ModuleList([nn.ReLU()])

        def fn(x):
            ml.append(nn.Tanh())
            ml.extend([nn.Sigmoid(), nn.Identity()])
            ml.insert(1, nn.Hardtanh(-0.5, 0.5))
            for m in ml:
                x = m(x)
            return x, len(ml), ml[-1]
        return ml, fn
    # the module returned is the one the list holds (one object per call)
    three_ways(make, (torch.randn(3, 4),), check=lambda m, r: (r[2] is m[-1], len(m)))


def test_moduledict_setitem_and_iteration():
    def make():
        md = nn.ModuleDict({"a": nn.ReLU()})

        def fn(x):
            md["b"] = nn.Tanh()
            out = x
            for k in md:
                out = md[k](out)
            return out, list(md.keys())
        return md, fn
    three_ways(make, (torch.randn(3, 4),))


def test_modules_added_are_seen_by_named_modules_and_sequential():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 4))

        def forward(self, x):
            if len(self.body) == 1:
                self.body.append(nn.ReLU())
            names = [k for k, _ in self.named_modules()]
            return self.body(x), names

    def make():
        m = M()
        return m, m
    three_ways(make, (torch.randn(2, 4),))


def test_replacing_an_internal_dict_is_refused():
    """`self._buffers = {...}` replaces a container the converter reads as the module's
    state: refused (a graph break at the store), the values and state stay right."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", torch.ones(3))

        def forward(self, x):
            y = x.cos()
            self._buffers = {"b": y * 2}
            return x + self.b

    report = ferrodyn.explain(M())(torch.randn(3))
    assert any("internal container '_buffers'" in str(r) for r in report.break_reasons)
    ferrodyn.reset()
    x = torch.randn(3)
    want_m, got_m = M(), M()
    compiled = ferrodyn.compile(got_m, backend=CountingBackend())
    for _ in range(2):
        assert same(compiled(x), want_m(x))
        assert same(module_state(got_m), module_state(want_m))


def test_replayed_dicts_are_seen_by_another_frames_guards():
    """Frame `read` is compiled against the module before frame `grow` (compiled) registers a
    buffer and a submodule through its replay: `read`'s guards on the module's dicts fail on
    its next call, which recompiles and sees the new state (as torch.compile does)."""
    def make():
        m = nn.Module()
        m.register_buffer("a", torch.ones(3))

        def grow(x):
            m.register_buffer(f"b{len(m._buffers)}", x * 2)
            if "act" not in m._modules:
                m.add_module("act", nn.Tanh())
            return x

        def read(x):
            out = x + sum(m.buffers())
            return m.act(out) if hasattr(m, "act") else out
        return m, (grow, read)

    results, counts = {}, {}
    x = torch.randn(3)
    for mode in ("eager", "ferrodyn", "torch"):
        m, fns = make()
        cb = CountingBackend()
        if mode == "ferrodyn":
            ferrodyn.reset()
            fns = [ferrodyn.compile(f, backend=cb) for f in fns]
        elif mode == "torch":
            torch._dynamo.reset()
            fns = [torch.compile(f, backend=cb) for f in fns]
        grow, read = fns
        results[mode] = [read(x), grow(x), read(x), grow(x), read(x), module_state(m)]
        counts[mode] = cb.count
    torch._dynamo.reset()
    assert same(results["ferrodyn"], results["eager"])
    assert counts["ferrodyn"] == counts["torch"]

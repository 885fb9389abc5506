"""Attribute stores and deletions on an nn.Module inside the compiled frame that
`Module.__setattr__`/`__delattr__` turn into registrations (variables/nn_module_state.py):
`self.buf = tensor` for a buffer, `self.sub = module`, `self.p = None` for a parameter,
`del self.buf` / `del self.sub`, and classes with their own `__setattr__`. torch's hook runs
inlined and writes into the module's dict trackers; replayed after the graph. Each case:
compiled vs eager (results, module state after every call, object identity where it matters)
and graph counts against torch.compile's in the same test."""

import pytest
import torch
import torch.nn as nn

import ferrodyn
from counting_backend import CountingBackend
from test_module_state import module_state, same, three_ways

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _own(cls):
    def make():
        m = cls()
        return m, m
    return make


def test_buffer_reassigned_in_forward():
    """`self.running = f(self.running)` replaces the registered buffer (persistence kept)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("running", torch.zeros(4))
            self.register_buffer("scratch", torch.zeros(4), persistent=False)

        def forward(self, x):
            self.running = self.running * 0.9 + x
            self.scratch = x * 2
            return x - self.running, "scratch" in self._non_persistent_buffers_set
    three_ways(_own(M), (torch.randn(4),))


def test_submodule_replaced_by_a_new_module():
    """The new module is what later reads in the frame call, and what the module holds after."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            y = self.act(x)
            self.act = nn.Tanh()
            return y + self.act(x)
    out = three_ways(_own(M), (torch.randn(4),))
    assert out["ferrodyn"][1] == 2  # the changed submodule's type guard recompiles once


def test_submodules_swapped_keep_identity():
    a0 = b0 = None

    def make():
        nonlocal a0, b0

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4, bias=False)

            def forward(self, x):
                self.a, self.b = self.b, self.a
                return self.a(x)
        m = M()
        a0, b0 = m.a, m.b
        return m, m
    three_ways(make, (torch.randn(4),), check=lambda m, r: (m.a is a0, m.b is b0))


def test_parameter_set_to_none():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            y = self.lin(x)
            self.lin.bias = None
            return y + self.lin(x), [k for k, _ in self.named_parameters()]
    three_ways(_own(M), (torch.randn(3),))


def test_submodule_set_to_none_and_deletions():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.sub = nn.Linear(3, 3)
            self.other = nn.Linear(3, 3)
            self.register_buffer("b", torch.ones(3))

        def forward(self, x):
            if self.sub is None:
                return x
            y = self.sub(x) + self.b + self.other(x)
            self.sub = None
            del self.other
            del self.b
            return y, hasattr(self, "other"), hasattr(self, "b"), self.sub is None
    three_ways(_own(M), (torch.randn(3),))


def test_custom_setattr_runs_inlined():
    class M(nn.Module):
        def __init__(self):
            object.__setattr__(self, "log", [])
            super().__init__()
            self.buffer = torch.rand(4)
            self.act = nn.ReLU()

        def __setattr__(self, name, value):
            if name != "log":
                self.log.append(name)
            super().__setattr__(name, value)

        def forward(self, x):
            self.buffer = self.buffer + x
            self.act = nn.Sigmoid()
            return self.act(self.buffer * 2)
    three_ways(_own(M), (torch.ones(4),), check=lambda m, r: list(m.log))


def test_frame_tensor_stored_as_buffer_is_refused():
    """`isinstance(x, nn.Buffer)` of a tensor from the frame reads its `_is_buffer` flag, which
    is not guarded: refused (a graph break at the store), values and state stay right."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.zeros(3))

        def forward(self, x):
            y = x.cos()
            self.buf = x
            return y + self.buf

    report = ferrodyn.explain(M())(torch.randn(3))
    assert any("nn.Buffer" in str(r) for r in report.break_reasons)
    ferrodyn.reset()
    want_m, got_m = M(), M()
    compiled = ferrodyn.compile(got_m, backend=CountingBackend())
    for x in (torch.randn(3), torch.randn(3), nn.Buffer(torch.randn(3), persistent=False)):
        assert same(compiled(x), want_m(x))
        assert same(module_state(got_m), module_state(want_m))
        assert got_m.buf is x


@pytest.mark.parametrize("how", ["object_setattr", "instance_dict"])
def test_internal_container_replaced_past_module_setattr_is_refused(how):
    """`object.__setattr__(self, "_buffers", ...)` / `self.__dict__["_buffers"] = ...` replace
    the dict `nn.Module.__getattr__` reads: refused where it would be read (a graph break),
    never read stale; values and state stay right."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", torch.ones(3))

        def forward(self, x):
            y = x.cos()
            if how == "object_setattr":
                object.__setattr__(self, "_buffers", {"a": y})
            else:
                self.__dict__["_buffers"] = {"a": y}
            return x + self.a

    report = ferrodyn.explain(M())(torch.randn(3))
    assert any("_buffers" in str(r) and ("internal container" in str(r) or "replaced" in str(r))
               for r in report.break_reasons), report.break_reasons
    ferrodyn.reset()
    want_m, got_m = M(), M()
    compiled = ferrodyn.compile(got_m, backend=CountingBackend())
    for x in (torch.randn(3), torch.randn(3)):
        assert same(compiled(x), want_m(x))
        assert same(module_state(got_m), module_state(want_m))


def test_module_registered_into_itself():
    """`m.child = m` registers the module in its own `_modules` (a cycle eager allows):
    replayed, named_modules deduplicates it."""
    def make():
        m = nn.Linear(2, 2)

        def fn(x):
            if "child" not in m._modules:
                m.child = m
            return m(x), [k for k, _ in m.named_modules()]
        return m, fn
    three_ways(make, (torch.randn(2),), check=lambda m, r: m.child is m)

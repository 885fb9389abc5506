"""`module.to(...)` / `.float()` / `.cpu()` & co. inside the compiled frame
(variables/nn_module_convert.py): a no-op conversion is the module itself (parameters, buffers
and grads keep their identity); a converting one, a tree with its own `_apply`, or torch's
`__future__` conversion switches turned on are refused (guarded), never guessed. Compiled vs
eager (results, module state, identity of the tensors), graph counts vs torch.compile's."""

import pytest
import torch
import torch.nn as nn

import ferrodyn
from counting_backend import CountingBackend
from test_module_state import module_state, same, three_ways

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

CONVERSIONS = {
    "to_dtype": lambda m: m.to(torch.float32),
    "to_device": lambda m: m.to("cpu"),
    "to_kwargs": lambda m: m.to(device=torch.device("cpu"), dtype=torch.float32, non_blocking=True),
    "float": lambda m: m.float(),
    "cpu": lambda m: m.cpu(),
    "eval_then_float": lambda m: m.eval().float(),
}


@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_noop_conversion_is_the_module(name):
    convert = CONVERSIONS[name]
    tensors = None

    def make():
        nonlocal tensors
        m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        m(torch.randn(3, 4)).sum().backward()  # grads present: kept as they are
        tensors = [*m.parameters(), *m.buffers(), *(p.grad for p in m.parameters())]

        def fn(x):
            c = convert(m)
            return c(x), c is m
        return m, fn

    def identities(m, r):
        now = [*m.parameters(), *m.buffers(), *(p.grad for p in m.parameters())]
        return [a is b for a, b in zip(now, tensors)]
    out = three_ways(make, (torch.randn(3, 4),), check=identities)
    assert out["ferrodyn"][1] == 1


def test_converting_call_is_refused():
    """`.double()` of a float module converts: refused (the call runs eagerly at a graph break),
    the module ends up double as eagerly."""
    def make():
        m = nn.Linear(4, 4)

        def fn(x):
            return m.double()(x.double()) + 1
        return m, fn
    torch.manual_seed(0)
    _, fn = make()
    report = ferrodyn.explain(fn)(torch.randn(2, 4))
    assert any("converting a parameter or buffer" in str(r) for r in report.break_reasons)
    ferrodyn.reset()
    three_ways(make, (torch.randn(2, 4),))


def test_tree_with_its_own_apply_is_refused():
    def make():
        m = nn.GRU(4, 4)

        def fn(x):
            return m.float()(x)[0] * 2
        return m, fn
    _, fn = make()
    report = ferrodyn.explain(fn)(torch.randn(2, 3, 4))
    assert any("its own _apply" in str(r) for r in report.break_reasons)
    ferrodyn.reset()
    torch.manual_seed(0)
    m, fn = make()
    want = fn(torch.ones(2, 3, 4))
    compiled = ferrodyn.compile(fn, backend=CountingBackend())
    assert same(compiled(torch.ones(2, 3, 4)), want)


@pytest.fixture
def overwrite_switch():
    old = torch.__future__.get_overwrite_module_params_on_conversion()
    yield
    torch.__future__.set_overwrite_module_params_on_conversion(old)


def test_future_overwrite_switch_is_guarded(overwrite_switch):
    """With `overwrite_module_params_on_conversion` on, `.float()` makes new Parameter objects
    even when nothing converts: a compiled no-op must not be reused once it is turned on."""
    m = nn.Linear(4, 4)

    def fn(x):
        return m.float()(x)
    backend = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=backend)
    x = torch.randn(2, 4)
    w0 = m.weight
    assert same(compiled(x), fn(x)) and m.weight is w0
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    want_m = nn.Linear(4, 4)
    want_w0 = want_m.weight
    want_m.float()
    got = compiled(x)
    assert (m.weight is w0) == (want_m.weight is want_w0) == False  # noqa: E712 (new objects)
    assert same(got, torch.nn.functional.linear(x, w0, m.bias))
    # the switch's guard failed: recompiled, the frame breaks at `.float()` (run eagerly, the
    # refusal) and the module call after it is the resumed graph
    assert backend.count == 2

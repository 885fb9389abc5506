"""The backend registry and the built-in backends, tested on hand-built fx graphs (no capture
involved): names resolve (ferrodyn's, lazy and torch.compile's), errors name the problem, and
every built-in backend computes what the graph computes."""

import pytest
import torch
import torch._dynamo.exc
import torch.fx

import ferrodyn
from ferrodyn import backends
from ferrodyn.backends import bind_backend, lookup_backend


def f(x, y):
    return (torch.sin(x) + y * 2, x.relu())


GM = torch.fx.symbolic_trace(f)


def test_builtins_and_torch_names_are_listed():
    names = ferrodyn.list_backends()
    assert {"eager", "inductor", "aot_eager", "aten_eager"} <= set(names)
    assert "cudagraphs" in names  # from torch.compile's registry
    assert names == sorted(names)


def test_torch_registry_names_resolve_to_torch_backends():
    from torch._dynamo.backends.registry import lookup_backend as torch_lookup

    assert lookup_backend("cudagraphs") is torch_lookup("cudagraphs")


def test_a_callable_is_its_own_backend():
    def mine(gm, inputs):
        return gm.forward
    assert lookup_backend(mine) is mine


def test_unknown_name_suggests_and_is_torchs_invalid_backend():
    with pytest.raises(torch._dynamo.exc.InvalidBackend, match=r"Invalid backend: 'eagr', did you mean: 'eager'"):
        lookup_backend("eagr")
    with pytest.raises(backends.InvalidBackend, match="ferrodyn.list_backends"):
        ferrodyn.compile(f, backend="no_such_backend")


def test_non_str_non_callable_backend_is_a_type_error():
    with pytest.raises(TypeError, match="backend must be a str or a callable, got int"):
        ferrodyn.compile(f, backend=3)


def test_register_backend_all_forms():
    @ferrodyn.register_backend
    def fd_test_plain(gm, inputs):
        return gm.forward

    @ferrodyn.register_backend(name="fd_test_named", tags=("debug",))
    def whatever(gm, inputs):
        return gm.forward

    assert lookup_backend("fd_test_plain") is fd_test_plain
    assert lookup_backend("fd_test_named") is whatever
    assert "fd_test_plain" in ferrodyn.list_backends()
    assert "fd_test_named" not in ferrodyn.list_backends()  # debug tag excluded by default
    assert "fd_test_named" in ferrodyn.list_backends(exclude_tags=())
    with pytest.raises(ValueError, match="duplicate backend name 'fd_test_plain'"):
        ferrodyn.register_backend(fd_test_plain)
    with pytest.raises(TypeError, match="must be callable"):
        ferrodyn.register_backend(42, name="x")


@pytest.mark.parametrize("name", ["eager", "aot_eager"])
def test_builtin_backend_computes_the_graph(name):
    x, y = torch.randn(5), torch.randn(5)
    compiled = bind_backend(name, mode=None, options=None, dynamic=None)(GM, [x, y])
    got, want = compiled(x, y), f(x, y)
    assert len(got) == 2 and all(torch.allclose(a, b) for a, b in zip(got, want))


def test_aot_eager_supports_backward():
    x = torch.randn(4, requires_grad=True)
    y = torch.randn(4)
    compiled = bind_backend("aot_eager", mode=None, options=None, dynamic=None)(GM, [x, y])
    compiled(x, y)[0].sum().backward()
    gx = x.grad.clone()
    x.grad = None
    f(x, y)[0].sum().backward()
    assert torch.allclose(gx, x.grad)


def test_inductor_computes_the_graph():
    x, y = torch.randn(8), torch.randn(8)
    compiled = bind_backend("inductor", mode=None, options=None, dynamic=None)(GM, [x, y])
    got, want = compiled(x, y), f(x, y)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want))


def test_inductor_options_are_checked_like_torch_compile():
    with pytest.raises(RuntimeError, match="Unexpected optimization option no_such_option"):
        ferrodyn.compile(f, options={"no_such_option": 1})
    with pytest.raises(RuntimeError, match="Unexpected type of attr max_autotune"):
        ferrodyn.compile(f, options={"max_autotune": "yes"})
    with pytest.raises(RuntimeError, match="Either mode or options"):
        ferrodyn.compile(f, mode="max-autotune", options={"max_autotune": True})
    with pytest.raises(TypeError, match="options must be a dict, got list"):
        ferrodyn.compile(f, options=[("max_autotune", True)])


def test_options_reach_a_custom_backend_as_keyword():
    seen = {}

    def custom(gm, inputs, **kwargs):
        seen.update(kwargs)
        return gm.forward

    bind_backend(custom, mode=None, options={"k": 1}, dynamic=None)(GM, [torch.randn(1), torch.randn(1)])
    assert seen == {"options": {"k": 1}}
    seen.clear()
    bind_backend(custom, mode="max-autotune", options=None, dynamic=None)(GM, [torch.randn(1), torch.randn(1)])
    assert seen == {"mode": "max-autotune"}
    assert bind_backend(custom, mode=None, options=None, dynamic=None) is custom

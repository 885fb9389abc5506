"""ferrodyn.make_fx on bad input: a clear error, no mode left installed, the tracker's weak
dictionaries empty afterwards."""

import pytest
import torch

from ferrodyn.proxy_dispatch import last_trace, make_fx

_KEYS = torch._C._TorchDispatchModeKey


def no_state_left():
    assert torch._C._len_torch_dispatch_stack() == 0
    assert torch._C._get_dispatch_mode(_KEYS.PROXY) is None
    assert torch._C._get_dispatch_mode(_KEYS.FAKE) is None
    assert torch._C._len_torch_function_stack() == 0
    assert not torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.Python)
    tracker = last_trace.get("tracker")
    if tracker is not None:
        assert len(tracker.tensors) == 0
        assert len(tracker.syms) == 0
        assert len(tracker.constants) == 0


@pytest.mark.parametrize("bad", [3, "f", None, [lambda x: x]])
def test_non_callable_is_refused(bad):
    with pytest.raises(TypeError, match="expected a callable"):
        make_fx(bad)
    no_state_left()


def test_unknown_tracing_mode():
    with pytest.raises(ValueError, match="tracing_mode must be one of"):
        make_fx(torch.sin, tracing_mode="meta")


def test_bad_decomposition_table():
    with pytest.raises(TypeError, match="decomposition_table must be a mapping"):
        make_fx(torch.sin, decomposition_table=[torch.ops.aten.sin.default])


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
@pytest.mark.parametrize(
    "args, where",
    [
        ((torch.randn(2), object()), r"args\[1\] is a builtins\.object"),
        ((torch.randn(2), [torch.randn(2), {"k": torch.nn.ReLU()}]), r"args\[1\]\[1\]\['k'\] is a "),
        ((torch.randn(2), lambda: 0), r"args\[1\] is a builtins\.function"),
    ],
)
def test_arguments_must_be_tensors_or_pytrees_of_them(mode, args, where):
    def f(x, y):
        return x + 1

    with pytest.raises(TypeError, match=where):
        make_fx(f, tracing_mode=mode)(*args)
    no_state_left()


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_error_inside_the_function_leaves_no_state(mode):
    def f(x):
        y = x * 2
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        make_fx(f, tracing_mode=mode)(torch.randn(3))
    no_state_left()
    # and the next trace works
    gm = make_fx(torch.cos, tracing_mode=mode)(torch.randn(3))
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        torch.ops.aten.cos.default
    ]
    no_state_left()


def test_data_dependent_op_in_real_mode():
    with pytest.raises(RuntimeError, match="reads the value of a tensor being traced"):
        make_fx(lambda x: x.sum().item() + 1)(torch.randn(3))
    no_state_left()
    # symbolic mode records it instead
    gm = make_fx(lambda x: x.sum().item(), tracing_mode="symbolic")(torch.randn(3))
    assert torch.ops.aten._local_scalar_dense.default in [n.target for n in gm.graph.nodes]
    no_state_left()


_lib = torch.library.Library("ferrodyn_test_nofake", "DEF")
_lib.define("cpu_only(Tensor x) -> Tensor")
_lib.impl("cpu_only", lambda x: x.sin(), "CPU")


@torch.library.custom_op("ferrodyn_test_nofake::custom", mutates_args=())
def _custom(x: torch.Tensor) -> torch.Tensor:
    return x.cos()


def test_op_without_fake_implementation():
    op = torch.ops.ferrodyn_test_nofake.cpu_only.default
    # real mode runs the kernel and records the op
    gm = make_fx(lambda x: op(x) + 1)(torch.randn(3))
    assert op in [n.target for n in gm.graph.nodes]
    with pytest.raises(RuntimeError, match=r"ferrodyn_test_nofake.cpu_only.default has no fake"):
        make_fx(lambda x: op(x) + 1, tracing_mode="symbolic")(torch.randn(3))
    no_state_left()
    with pytest.raises(RuntimeError, match="no fake impl"):
        make_fx(lambda x: _custom(x) + 1, tracing_mode="fake")(torch.randn(3))
    no_state_left()


def test_dictionaries_empty_after_a_successful_trace():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    keep = torch.randn(2, 4)
    for mode in ["real", "fake", "symbolic"]:
        make_fx(model, tracing_mode=mode)(keep)
        no_state_left()

"""ferrodyn.make_fx records the same values as torch's make_fx: node by node over the program
table of test_make_fx.py (plus programs using parameters, buffers and closed-over constants
under fake modes), every node's `meta["val"]` has torch's type, shape, strides, dtype, device
and storage offset. (The op sequence and re-run results: test_make_fx.py.)"""

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx as torch_make_fx

from ferrodyn.proxy_dispatch import last_trace, make_fx
from test_make_fx import MODES, PROGRAMS, assert_same

torch.manual_seed(4321)
_lin = torch.nn.Linear(6, 6)
_bn = torch.nn.BatchNorm1d(6)  # training: running stats are updated in place
_table = torch.randn(6)
_scale = torch.tensor(2.0)


def params_twice(x):
    # the same parameters in several ops, and directly as an output
    return _lin(_lin(x)), _lin.weight.t() @ x.t(), _lin.bias


def buffers_in_place(x):
    y = _bn(x)
    return y, _bn.running_mean * 1


def constants_mixed(x):
    # closed-over tensors alone (the fake mode keeps those results as constants), mixed with
    # traced ones, and a 0-dim constant read back with .item()
    c = _table * 2 + 1
    k = _scale * 3
    return x * c + k, x.sum() * k.item(), torch.tensor([1.0, 2.0]) + _scale


FAKE_PROGRAMS = {
    "params_twice": (params_twice, lambda: (torch.randn(6, 6),)),
    "buffers_in_place": (buffers_in_place, lambda: (torch.randn(4, 6),)),
    "constants_mixed": (constants_mixed, lambda: (torch.randn(6),)),
}
ALL = {**PROGRAMS, **FAKE_PROGRAMS}


def describe(v):
    if isinstance(v, torch.Tensor):
        return (type(v).__name__, str(v.shape), str(v.stride()), v.dtype, v.device,
                str(v.storage_offset()), v.requires_grad, v._is_view(), v.grad_fn is None)
    if isinstance(v, (list, tuple)):
        return type(v).__name__, [describe(x) for x in v]
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return type(v).__name__, str(v)
    return type(v).__name__, v if isinstance(v, (int, float, bool, type(None))) else None


# .item() of a traced value is refused in real mode (test_make_fx_errors.py)
CASES = [(name, mode) for name in sorted(ALL) for mode in MODES
         if not (name == "constants_mixed" and mode == "real")]


@pytest.mark.parametrize("name, mode", CASES)
def test_meta_vals_match_torch_make_fx(name, mode):
    fn, make_args = ALL[name]
    args = make_args()
    state = {k: v.clone() for k, v in _bn.state_dict().items()}
    torch.manual_seed(0)
    ours = make_fx(fn, tracing_mode=mode)(*args)
    _bn.load_state_dict(state)
    torch.manual_seed(0)
    ref = torch_make_fx(fn, tracing_mode=mode, _allow_non_fake_inputs=True)(*args)
    _bn.load_state_dict(state)
    got = [(n.op, str(n.target), describe(n.meta.get("val"))) for n in ours.graph.nodes]
    want = [(n.op, str(n.target), describe(n.meta.get("val"))) for n in ref.graph.nodes]
    assert got == want
    assert not last_trace["tracker"]._fakes  # the trace's fakes are dropped when it ends
    # tracing under a fake mode never touches the real state
    assert all(torch.equal(state[k], v) for k, v in _bn.state_dict().items())
    torch.manual_seed(7)
    expected = fn(*args)
    _bn.load_state_dict(state)
    torch.manual_seed(7)
    assert_same(ours(*args), expected)
    _bn.load_state_dict(state)


# -- real tensors handed to the fake mode as the trace's fakes: where the fake mode would not
#    convert them itself, it is not done either ------------------------------------------------

def _trace_both(fn, mode, args):
    """(ours, torch's) outcome: the GraphModule or the exception type and message."""
    out = []
    for tracer in (lambda: make_fx(fn, tracing_mode=mode)(*args),
                   lambda: torch_make_fx(fn, tracing_mode=mode, _allow_non_fake_inputs=True)(*args)):
        try:
            out.append(tracer())
        except Exception as e:  # noqa: BLE001 - the outcome is compared
            out.append(e)
    return out


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_in_place_op_on_a_parameter_leaves_it_unchanged(mode):
    lin = torch.nn.Linear(3, 3)
    before = lin.weight.detach().clone()

    def f(x):
        with torch.no_grad():
            lin.weight.add_(x.mean())  # in place on the parameter's fake, inside the trace
        return lin(x) + lin.weight.sum()

    x = torch.randn(2, 3)
    ours, ref = _trace_both(f, mode, (x,))
    assert torch.equal(lin.weight, before)
    got = [(n.op, str(n.target), describe(n.meta.get("val"))) for n in ours.graph.nodes]
    want = [(n.op, str(n.target), describe(n.meta.get("val"))) for n in ref.graph.nodes]
    assert got == want
    # the graph replays the mutation on the module's real parameter, as eager does
    with torch.no_grad():
        got_out = ours(x)
        after = lin.weight.detach().clone()
        lin.weight.copy_(before)
        expected = f(x)
    torch.testing.assert_close(got_out, expected)
    assert torch.equal(after, lin.weight)


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_metadata_mutation_of_a_real_tensor_is_refused_as_by_torch(mode):
    w = torch.randn(2, 3)

    def f(x):
        w.t_()
        return x + 1

    ours, ref = _trace_both(f, mode, (torch.randn(2),))
    assert type(ours) is type(ref) and isinstance(ref, Exception)
    assert "non-Fake Tensor" in str(ours) and "non-Fake Tensor" in str(ref)
    assert w.shape == (2, 3)


def test_user_fake_mode_without_non_fake_inputs_still_refuses_real_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    w = torch.randn(3)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    x = fake_mode.from_tensor(torch.randn(3))

    def f(x):
        return x * w

    with pytest.raises(AssertionError, match="Please convert all Tensors to FakeTensors"):
        make_fx(f, tracing_mode="fake")(x)
    with pytest.raises(AssertionError, match="Please convert all Tensors to FakeTensors"):
        torch_make_fx(f, tracing_mode="fake")(x)


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_real_computation_with_fake_mode_unset_sees_real_tensors(mode):
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    w = torch.tensor([1.0, 2.0, 3.0])
    seen = []

    def f(x):
        with unset_fake_temporarily():
            s = (w * 2).sum()  # real compute on the real tensor (not its fake)
            seen.append(s)
        return x + w

    x = torch.randn(3)
    ours, ref = _trace_both(f, mode, (x,))
    assert len(seen) == 2 and all(type(s) is torch.Tensor for s in seen)
    assert all(torch.equal(s, torch.tensor(12.0)) for s in seen)
    assert [str(n.target) for n in ours.graph.nodes] == [str(n.target) for n in ref.graph.nodes]
    torch.testing.assert_close(ours(x), f(x))

"""Context managers over torch's global state, compiled vs eager: `torch.inference_mode`,
`torch.nn.attention.sdpa_kernel`, `torch._C.DisableTorchFunction(Subclass)`,
`torch.cuda.amp.autocast`, `torch._C._set_grad_enabled` (a function returning None), and the
types of the grad-mode / autocast objects. Each test checks the values, `requires_grad` and
inference-ness of the outputs, torch's state after the call (grad mode, inference mode, the
SDPA backends, torch function enabled), and the graph count against torch.compile's."""

import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends, sdpa_kernel
import torch.nn.functional as F

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

GB = torch._dynamo.graph_break
SEEN = []


def probe():
    """Records the state it runs under; its print breaks the graph (it runs in the entry)."""
    SEEN.append(_probe_state())
    print(end="")


def _probe_state():
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch._C._is_torch_function_enabled(), tuple(_cur_sdpa_kernel_backends()),
            torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"))


def _state():
    return (*_probe_state(), torch._C._autograd._saved_tensors_hooks_get_disabled_error_message())


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.requires_grad == want.requires_grad
        assert got.is_inference() == want.is_inference()
        torch.testing.assert_close(got.detach(), want.detach())
    else:
        assert got == want


def run_both(fn, make_args, outer=torch.enable_grad, torch_may_fail=False):
    """fn compiled by ferrodyn (three calls: a miss and two hits) and by torch.compile, each
    against eager on fresh inputs; returns (ferrodyn graphs, torch.compile graphs)."""
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    for _ in range(3):
        SEEN.clear()
        with outer():
            want, state_want, seen_want = fn(*make_args()), _state(), list(SEEN)
        SEEN.clear()
        with outer():
            got, state_got = cf(*make_args()), _state()
        _same(got, want)
        assert state_got == state_want
        assert SEEN == seen_want
    torch._dynamo.reset()
    try:
        with outer():
            torch.compile(fn, backend=theirs)(*make_args())
    except torch._dynamo.exc.InternalTorchDynamoError:
        if not torch_may_fail:
            raise
        return ours.count, None
    finally:
        torch._dynamo.reset()
    return ours.count, theirs.count


def _x(*shape, rg=True):
    return lambda: (torch.randn(*shape, generator=torch.Generator().manual_seed(0)).requires_grad_(rg),)


def test_inference_mode_block_is_one_graph():
    def fn(x):
        with torch.inference_mode():
            y = x * 2
            flag = torch.is_inference_mode_enabled()
        return y + 1, flag

    ours, theirs = run_both(fn, _x(4))
    assert ours == 1 <= theirs


def test_inference_mode_false_inside_inference_mode():
    def fn(x):
        with torch.inference_mode(False):
            y = x * 2
        return y, torch.is_inference_mode_enabled()

    ours, theirs = run_both(fn, _x(4, rg=False), outer=torch.inference_mode)
    assert ours == 1 <= theirs


def test_inference_mode_graph_break_reenters_it():
    def fn(x):
        with torch.inference_mode():
            y = x * 2
            probe()
            z = y + torch.is_inference_mode_enabled()
        return z.clone(), x + 1

    ours, theirs = run_both(fn, _x(3))
    assert ours == 2 <= theirs


def test_inference_mode_compiled_outside_called_inside_grad_off():
    def fn(x):
        with torch.inference_mode():
            return x.sin()

    ours, theirs = run_both(fn, _x(3), outer=torch.no_grad)
    assert ours == 1 <= theirs


def test_sdpa_kernel_sets_and_restores_backends():
    seen = []

    def fn(x):
        with sdpa_kernel([SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(x, x, x)
        return out

    ours, theirs = run_both(fn, _x(2, 2, 2, 2))
    assert ours == 1 <= theirs
    # the graph restores whatever it was called under (not the state seen while tracing)
    cf = ferrodyn.compile(fn, backend=CountingBackend())
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION]):
        before = _cur_sdpa_kernel_backends()
        cf(*_x(2, 2, 2, 2)())
        seen.append(_cur_sdpa_kernel_backends())
    assert seen == [before]


def test_sdpa_kernel_single_backend_and_break():
    def fn(x):
        with sdpa_kernel(SDPBackend.MATH) as v:
            x = x + 1
            probe()
            out = F.scaled_dot_product_attention(x, x, x)
        return out, v

    ours, theirs = run_both(fn, _x(2, 2, 2, 2))
    assert ours == 2 <= theirs


def test_disable_torch_function_contexts():
    def fn(x):
        with torch._C.DisableTorchFunctionSubclass():
            y = x + 1
            a = torch._C._is_torch_function_enabled()
        with torch._C.DisableTorchFunction():
            y = y * 2
        return y, a, torch._C._is_torch_function_enabled()

    ours, theirs = run_both(fn, _x(4))
    assert ours == 1 <= theirs


def test_c_set_grad_enabled_returns_none():
    def fn(x):
        r = torch._C._set_grad_enabled(False)
        y = x * 2
        torch._C._set_grad_enabled(True)
        return y, r is None

    ours, theirs = run_both(fn, _x(4))
    assert ours == 1 <= theirs


def test_grad_mode_and_autocast_object_types():
    def fn(x):
        g, s = torch.no_grad(), torch.set_grad_enabled(False)
        torch.set_grad_enabled(True)
        return (x + 1, isinstance(g, torch.no_grad), type(s).__name__,
                type(torch.enable_grad()) is torch.enable_grad,
                isinstance(torch.autocast("cpu"), torch.autocast))

    ours, theirs = run_both(fn, _x(4))
    assert ours == 1 <= theirs


def test_cuda_amp_autocast_disabled_runs_on_cpu():
    def fn(x):
        with torch.cuda.amp.autocast(enabled=False):
            y = x @ x
        return y

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # torch.compile on Python 3.13 fails on torch.cuda.amp.autocast (KeyError: dtype)
        ours, theirs = run_both(fn, _x(3, 3), torch_may_fail=True)
    assert ours == 1 and theirs in (None, 1)


@pytest.mark.parametrize("bad", [lambda: torch.set_grad_enabled(1), lambda: torch._C._set_grad_enabled(1)])
def test_grad_mode_non_bool_raises_like_eager(bad):
    def fn(x):
        bad()
        return x + 1

    with pytest.raises(TypeError):
        fn(torch.ones(2))
    with pytest.raises(TypeError):
        ferrodyn.compile(fn, backend=CountingBackend())(torch.ones(2))
    assert torch.is_grad_enabled()


def test_record_function_with_a_break_inside():
    def fn(x):
        y = x ** 2
        with torch.autograd.profiler.record_function("region"):
            z = y ** 3
            probe()
            z = z + 1
        return z

    ours, theirs = run_both(fn, _x(3))
    assert ours == 2 <= theirs


def test_disable_saved_tensors_hooks_nested_with_a_break():
    def fn(x):
        with torch.autograd.graph.disable_saved_tensors_hooks("outer"):
            with torch.autograd.graph.disable_saved_tensors_hooks("inner"):
                y = x * 2
                probe()
                y = y.sin()
            z = y * 3
        return z

    ours, theirs = run_both(fn, _x(3))
    assert ours == 2 <= theirs
    # the graph restores the message it was called under
    cf = ferrodyn.compile(fn, backend=CountingBackend())
    with torch.autograd.graph.disable_saved_tensors_hooks("caller"):
        cf(*_x(3)())
        assert torch._C._autograd._saved_tensors_hooks_get_disabled_error_message() == "caller"

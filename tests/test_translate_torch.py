"""torch.*, torch.nn.functional.*, tensor methods and attributes, and the grad-mode /
autocast context managers recorded into the graph."""

import pytest
import torch
import torch.nn.functional as F

from translate_harness import check, count_ops, trace, run_traced


def torch_fns(x, y):
    a = torch.cat([x, y], dim=0)
    b = torch.stack((x, y)).mean(0)
    c = torch.where(x > 0, x, y)
    d = torch.zeros(2, 3) + torch.ones_like(x) + torch.arange(3.0)
    e = F.softmax(x, dim=-1) + F.gelu(y) + F.layer_norm(x, (3,))
    f = torch.einsum("ij,kj->ik", x, y)
    vals, idx = torch.max(x, dim=1)
    mx = x.max(dim=0)
    return a, b, c, d, e, f, vals, idx, mx.values, mx.indices, torch.split(x, 1)


def tensor_methods(x):
    a = x.view(-1).reshape(3, 2).transpose(0, 1).contiguous()
    b = x.sum(dim=1, keepdim=True).expand(2, 3).float().to(torch.float64)
    c = x.unsqueeze(0).squeeze(0).permute(1, 0).flatten()
    n = x.size(0) + x.size()[1] + x.dim() + x.numel() + x.ndim
    return a, b, c, n, x.T, x.mT, x.shape, x.dtype, x.device, x.requires_grad


def attrs_and_metadata(x):
    if x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[-1] == 3:
        y = x.new_zeros(x.shape) + x
    else:
        y = x
    return y, x.shape[0] * 2, len(x), x.stride(), x.is_contiguous()


def item_on_constant(x):
    t = torch.tensor(3.0)
    return x * 2


def grad_modes(x, w):
    with torch.no_grad():
        a = x * w
        with torch.enable_grad():
            b = x * w
    c = x * w
    torch.set_grad_enabled(False)
    d = x * w
    torch.set_grad_enabled(True)
    with torch.set_grad_enabled(False):
        e = x * w
    return a, b, c, d, e


def autocast_cpu(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        b = torch.mm(x, w)
    c = x @ w
    return a, b, c


def autocast_cpu_legacy(x, w):
    with torch.cpu.amp.autocast():
        a = x @ w
    return a, x @ w


@pytest.mark.parametrize("fn,args", [
    (torch_fns, (torch.randn(2, 3), torch.randn(2, 3))),
    (tensor_methods, (torch.randn(2, 3),)),
    (attrs_and_metadata, (torch.randn(2, 3),)),
    (item_on_constant, (torch.randn(2),)),
    (grad_modes, (torch.randn(2, 3), torch.randn(2, 3, requires_grad=True))),
    (autocast_cpu, (torch.randn(4, 4), torch.randn(4, 4))),
])
def test_torch(fn, args):
    check(fn, *args)


def test_autocast_legacy():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(autocast_cpu_legacy, torch.randn(4, 4), torch.randn(4, 4))


def test_grad_mode_recorded_as_graph_calls_and_restored():
    r = trace(grad_modes, torch.randn(2, 3), torch.randn(2, 3, requires_grad=True))
    # the switches an op observes (False, True, False and the final True; a switch back to
    # the mode already set, or overridden before any op, is erased, as torch.compile does)
    assert count_ops(r, torch._C._set_grad_enabled) == 4
    assert torch.is_grad_enabled()
    # running the graph leaves grad mode as it found it, each op under its block's mode
    outs = r.graph(torch.randn(2, 3), torch.randn(2, 3, requires_grad=True))
    assert torch.is_grad_enabled()
    assert [o.requires_grad for o in outs] == [False, True, True, False, False]


def test_grad_mode_restored_when_trace_fails():
    from ferrodyn.exc import Unsupported

    def f(x):
        with torch.no_grad():
            y = x * 2
            if y.sum() > 0:
                return y
        return x
    with pytest.raises(Unsupported):
        trace(f, torch.randn(3))
    assert torch.is_grad_enabled()


def test_autocast_recorded_and_state_restored():
    r = trace(autocast_cpu, torch.randn(4, 4), torch.randn(4, 4))
    assert count_ops(r, torch.amp._enter_autocast) == 1
    assert count_ops(r, torch.amp._exit_autocast) == 1
    assert not torch.is_autocast_enabled("cpu")


def test_outputs_requires_grad_match_eager():
    def f(x, w):
        y = x @ w
        with torch.no_grad():
            z = y * 2
        return y, z
    x, w = torch.randn(2, 2), torch.randn(2, 2, requires_grad=True)
    r = trace(f, x, w)
    y, z = run_traced(r, f, x, w)
    assert y.requires_grad and not z.requires_grad
    y.sum().backward()
    assert w.grad is not None


def item_of_constant_tensor(x):
    t = torch.tensor([2.0, 3.0])
    n = t[0].item() if False else t.sum().item() if False else torch.tensor(4).item()
    k = int(torch.tensor(3)) + float(torch.scalar_tensor(1.5))
    if torch.tensor(True):
        x = x + 1
    return x * n + k, t.tolist() if False else n


def test_item_on_constants():
    check(item_of_constant_tensor, torch.randn(3))


def test_item_on_constant_after_inplace_is_refused():
    from ferrodyn.exc import Unsupported

    def f(x):
        t = torch.tensor(2.0)
        t.add_(x.sum())
        return x * t.item()
    with pytest.raises(Unsupported):
        trace(f, torch.randn(3))


@torch.no_grad()
def decorated_no_grad(x, w):
    return x * w


@torch.enable_grad()
def decorated_enable_grad(x, w):
    return x * w


def calls_decorated(x, w):
    with torch.no_grad():
        b = decorated_enable_grad(x, w)
    return decorated_no_grad(x, w), b, x * w


def test_grad_mode_decorators():
    r = check(calls_decorated, torch.randn(3), torch.randn(3, requires_grad=True))
    # enable_grad inside no_grad around b's op changes nothing (erased); decorated_no_grad's
    # op runs between a switch to False and one back to True
    assert count_ops(r, torch._C._set_grad_enabled) == 2

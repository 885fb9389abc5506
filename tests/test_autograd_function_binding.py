"""Custom autograd Functions called with keyword arguments, returning constants beside their
tensors, writing in place to fresh tensors they compute, storing private ctx attributes, with
classmethod forward/backward (variables/autograd_function.py): captured as one node whose results and gradients are eager's,
with graph counts at most torch.compile's; what apply would reject stays eager's error."""

import pytest
import torch
import torch._dynamo

import ferrodyn
from counting_backend import CountingBackend
from test_autograd_function import _captured, _run

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


# ---- Functions --------------------------------------------------------------------------------

class SinScale(torch.autograd.Function):
    """Old style: forward(ctx, ...), a parameter with a default."""

    @staticmethod
    def forward(ctx, x, factor=1.0, shift=0.0):
        ctx.save_for_backward(x)
        ctx.factor = factor
        return factor * torch.sin(x) + shift

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        assert len(ctx.needs_input_grad) in (1, 2, 3)
        return (g * ctx.factor * torch.cos(x),) + (None,) * (len(ctx.needs_input_grad) - 1)


class AffineNew(torch.autograd.Function):
    """setup_context style: apply binds every parameter, defaults applied."""

    @staticmethod
    def forward(x, scale=2.0, bias=1.0):
        return x * scale + bias

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, scale, bias = inputs  # three inputs even when apply got one
        ctx.scale = scale
        ctx.n = len(ctx.needs_input_grad)

    @staticmethod
    def backward(ctx, g):
        return (g * ctx.scale,) + (None,) * (ctx.n - 1)


class TwoTensors(torch.autograd.Function):
    @staticmethod
    def forward(x, y):
        return x * 2 + y

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 2, g


class WithCount(torch.autograd.Function):
    """Returns a tensor, an int, None and a list of ints (non-tensor outputs get no grad)."""

    @staticmethod
    def forward(ctx, x):
        return x * 3, x.dim() + 1, None, [1, 2]

    @staticmethod
    def backward(ctx, g, g_int, g_none, g_list):
        assert g_int is None and g_none is None and g_list is None
        return g * 3


class LinearBias(torch.autograd.Function):
    """Writes in place to the fresh tensor it computes, reading an argument (not writing it)."""

    @staticmethod
    def forward(x, w, b):
        out = x.mm(w.t())
        if b is not None:
            out += b.unsqueeze(0).expand_as(out)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, w, b = ctx.saved_tensors
        gx = g.mm(w) if ctx.needs_input_grad[0] else None
        gw = g.t().mm(x) if ctx.needs_input_grad[1] else None
        gb = g.sum(0) if b is not None and ctx.needs_input_grad[2] else None
        return gx, gw, gb


class AmpMM(torch.autograd.Function):
    """torch.amp.custom_fwd / custom_bwd store ctx._dtype and ctx._fwd_used_autocast."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a.mm(b)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g.mm(b.t()), a.t().mm(g)


def _xs(*shapes, grads=None):
    def make():
        torch.manual_seed(0)
        flags = grads or [True] * len(shapes)
        return tuple(torch.randn(*s, requires_grad=f) for s, f in zip(shapes, flags))
    return make


def _both(fn, *args):
    """fn with ferrodyn and torch.compile (CountingBackend each) on `args`."""
    ours, theirs = CountingBackend(), CountingBackend()
    got = ferrodyn.compile(fn, backend=ours)(*args)
    torch._dynamo.reset()
    torch.compile(fn, backend=theirs)(*args)
    torch._dynamo.reset()
    return got, ours, theirs


# ---- keyword arguments --------------------------------------------------------------------------

@pytest.mark.parametrize("call,inner", [
    (lambda x: SinScale.apply(x, factor=6.0), "eager"),
    (lambda x: SinScale.apply(x, 2.0, shift=0.5), "aot_eager"),
    (lambda x: SinScale.apply(x=x), "eager"),
    (lambda x: AffineNew.apply(x), "eager"),
    (lambda x: AffineNew.apply(x, scale=3.0, bias=-1.0), "aot_eager"),
], ids=["old_kw", "old_pos_and_kw", "old_all_kw", "new_defaults", "new_all_kw"])
def test_keyword_arguments_are_bound_as_apply_binds_them(call, inner):
    ours, theirs = _run(lambda x: call(x.cos()) * 2, _xs((4,)), inner=inner)
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, SinScale) or _captured(ours, AffineNew)


def test_keyword_after_a_defaulted_parameter_of_a_setup_context_forward():
    # apply binds `scale` to its default between x and the keyword `bias` (setup_context sees
    # three inputs); torch.compile of this pinned torch raises on it, so eager is the reference
    def fn(x):
        return AffineNew.apply(x.cos(), bias=4.0) * 2

    ours = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=ours)
    for _ in range(2):
        x = torch.randn(4, requires_grad=True)
        got, want = compiled(x), fn(x)
        assert torch.equal(got, want)
        assert torch.equal(torch.autograd.grad(got.sum(), x)[0],
                           torch.autograd.grad(want.sum(), x)[0])
    assert ours.count == 1 and _captured(ours, AffineNew)


def test_all_tensor_arguments_by_keyword_and_inference():
    ours, theirs = _run(lambda x, y: TwoTensors.apply(y=y, x=x), _xs((3,), (3,)))
    assert ours.count == 1 <= theirs.count and _captured(ours, TwoTensors)
    ours, theirs = _run(lambda x: SinScale.apply(x, factor=6.0), _xs((3,), grads=[False]))
    assert ours.count == 1 <= theirs.count and _captured(ours, SinScale)


@pytest.mark.parametrize("call", [
    lambda x: SinScale.apply(x, shift=1.0),      # old style: a gap before `shift`
    lambda x: SinScale.apply(x, 2.0, factor=3.0),  # `factor` given twice
    lambda x: SinScale.apply(x, scale=3.0),      # no such parameter
], ids=["gap", "twice", "unknown"])
def test_keywords_apply_rejects_raise_eagers_type_error(call):
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError) as want:
        call(x)
    ours = CountingBackend()
    with pytest.raises(TypeError) as got:
        ferrodyn.compile(call, backend=ours)(x)
    assert str(got.value) == str(want.value)
    assert not _captured(ours, SinScale)


def test_changing_forward_defaults_recompiles():
    class Shifted(torch.autograd.Function):
        @staticmethod
        def forward(x, shift=1.0):
            return x + shift

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.shift = inputs[1]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.shift, None

    def fn(x):
        return Shifted.apply(x) * 2

    ours = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=ours)
    x = torch.randn(3, requires_grad=True)
    compiled(x)
    Shifted.forward.__defaults__ = (5.0,)
    got = compiled(x)
    want = fn(x)
    assert torch.equal(got, want)
    assert torch.equal(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])
    assert ours.count == 2


# ---- outputs ------------------------------------------------------------------------------------

def test_constants_beside_tensors_in_the_output():
    def fn(x):
        y, n, nothing, ks = WithCount.apply(x.sin())
        return y * n + ks[1], nothing, ks

    ours, theirs = _run(fn, _xs((2, 3)))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, WithCount)


def test_returned_constant_list_is_a_fresh_list_each_call():
    def fn(x):
        out = WithCount.apply(x)
        out[3].append(3)  # the caller's own list: eager builds a new one per call
        return out[0], out[3]

    x = torch.randn(2, requires_grad=True)
    got, ours, theirs = _both(fn, x)
    want = fn(x)
    assert got[1] == want[1] == [1, 2, 3]
    assert torch.equal(got[0], want[0]) and ours.count == 1 <= theirs.count


# ---- in-place writes, ctx attributes ------------------------------------------------------------

@pytest.mark.parametrize("inner,grads", [("eager", [True, True, True]),
                                         ("aot_eager", [True, False, True]),
                                         ("eager", [False, True, False])])
def test_in_place_write_to_a_fresh_tensor_reading_an_argument(inner, grads):
    ours, theirs = _run(lambda x, w, b: LinearBias.apply(x, w, b).relu(),
                        _xs((2, 3), (4, 3), (4,), grads=grads), inner=inner)
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, LinearBias)


def test_amp_custom_fwd_and_bwd():
    ours, theirs = _run(lambda a, b: AmpMM.apply(a, b).tanh(), _xs((4, 4), (4, 4)))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, AmpMM)


def test_store_of_an_autograd_attribute_on_ctx_breaks():
    class Sneaky(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.materialize_grads = False  # autograd's own field (a _FunctionBase descriptor)
            return x.clone(), x.clone()

        @staticmethod
        def backward(ctx, g1, g2):
            return g1 if g2 is None else g1 + g2

    ours, theirs = _run(lambda x: Sneaky.apply(x)[0] * 2, _xs((3,)))
    assert not _captured(ours, Sneaky)


# ---- classmethod forward / backward -------------------------------------------------------------

class Scaled(torch.autograd.Function):
    k = 2.0

    @classmethod
    def forward(cls, ctx, x, scale=1.0):
        ctx.save_for_backward(x)
        return x * cls.k * scale

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        return g * cls.k + x * 0, None


class Shake(torch.autograd.Function):
    @classmethod
    def forward(cls, ctx, x):
        return x + x

    @classmethod
    def backward(cls, ctx, g):
        return g * 3


def test_classmethod_forward_and_backward():
    ours, theirs = _run(lambda x: Shake.apply(x.cos()).sin(), _xs((3,)))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, Shake)
    # with a further argument and a class attribute read (torch.compile: 0 graphs here)
    ours, _ = _run(lambda x: Scaled.apply(x.cos(), 3.0).sin(), _xs((3,)))
    assert ours.count == 1 and _captured(ours, Scaled)


def test_classmethod_class_attribute_change_recompiles():
    def fn(x):
        return Scaled.apply(x, 3.0)

    ours = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=ours)
    x = torch.randn(3, requires_grad=True)
    try:
        compiled(x)
        compiled(x)
        Scaled.k = 5.0
        got, want = compiled(x), fn(x)
    finally:
        Scaled.k = 2.0
    assert torch.equal(got, want)
    assert ours.count == 2


def test_classmethod_forward_with_keywords_raises_eagers_error():
    # apply binds keywords by forward's __code__ skipping one parameter (ctx), not cls too
    def fn(x):
        return Scaled.apply(x, scale=3.0)

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError) as want:
        fn(x)
    with pytest.raises(TypeError) as got:
        ferrodyn.compile(fn, backend=CountingBackend())(x)
    assert str(got.value) == str(want.value)

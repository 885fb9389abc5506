"""Custom `torch.autograd.Function`s (`Cls.apply(...)`) captured as one graph node that calls the
real `apply` (variables/autograd_function.py): results, `requires_grad` and gradients through
the graph are eager's (the user's backward runs), graph counts are at most torch.compile's. A
Function whose forward has an effect outside it (print, a global mutation) is refused: the
graph breaks at the call and values stay eager's. Functions writing to their arguments
(`mark_dirty` or not): test_autograd_function_dirty.py."""

import pytest
import torch
import torch._dynamo
from torch import nn

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


# ---- Functions --------------------------------------------------------------------------------

class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, g):
        return g


class ScaledGelu(torch.autograd.Function):
    """save_for_backward and attributes on ctx."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * torch.sigmoid(1.702 * x) * scale

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        s = torch.sigmoid(1.702 * x)
        return g * ctx.scale * (s + 1.702 * x * s * (1 - s)), None


class MulAdd(torch.autograd.Function):
    """setup_context style, two outputs."""

    @staticmethod
    def forward(x, y):
        return x * y, x + y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y = inputs
        ctx.save_for_backward(x, y)

    @staticmethod
    def backward(ctx, g_prod, g_sum):
        x, y = ctx.saved_tensors
        return g_prod * y + g_sum, g_prod * x + g_sum


class WithConstants(torch.autograd.Function):
    """Non-tensor arguments: int, float, bool, None, tuple; needs_input_grad."""

    @staticmethod
    def forward(ctx, x, k, alpha, flip, nothing, dims):
        ctx.k, ctx.alpha, ctx.flip = k, alpha, flip
        ctx.needs = ctx.needs_input_grad[0]
        y = x.pow(k) * alpha
        if flip:
            y = y.flip(dims)
        return y if nothing is None else y + 1

    @staticmethod
    def backward(ctx, g):
        if ctx.flip:
            g = g.flip(0)
        return g * ctx.alpha * 3.0, None, None, None, None, None


class TopWithIndex(torch.autograd.Function):
    """mark_non_differentiable on an integer output; set_materialize_grads."""

    @staticmethod
    def forward(ctx, x):
        idx = x.argmax(dim=-1)
        ctx.mark_non_differentiable(idx)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, idx

    @staticmethod
    def backward(ctx, g, g_idx):
        return g * 2


class Printing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        print("forward ran")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


LOG = []


class GlobalMutation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        LOG.append(1)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


SHIFT = torch.tensor([0.5, -1.0, 2.0])


class ReadsGlobalTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x + SHIFT

    @staticmethod
    def backward(ctx, g):
        return g


class Doubler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 5  # deliberately not the true gradient: the user's backward must run


class Tripler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 7


class LogsWhenGradNeeded(torch.autograd.Function):
    """An effect that depends on ctx.needs_input_grad (True for a requires_grad input even
    under no_grad, as in eager)."""

    @staticmethod
    def forward(ctx, x):
        if ctx.needs_input_grad[0]:
            LOG.append("needs grad")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class ListArg(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dims, grow):
        if grow:
            dims.append(0)
        ctx.dims = dims
        return x.permute(*dims[:2]) * 2

    @staticmethod
    def backward(ctx, g):
        return g.permute(*ctx.dims[:2]) * 2, None, None


class OnceDiff(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.exp() * 0.5


# ---- harness ------------------------------------------------------------------------------------

def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _grads(out, args):
    leaves = [a for a in _tensors(args) if a.requires_grad]
    outs = [t for t in _tensors(out) if t.grad_fn is not None]
    if not leaves or not outs:
        return None
    loss = sum(t.float().sum() * (i + 1) for i, t in enumerate(outs))
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def _same(got, want, exact):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert got.requires_grad == want.requires_grad
        assert (got.grad_fn is None) == (want.grad_fn is None)
        if exact:
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want), (got, want)
        else:
            torch.testing.assert_close(got, want)
        return
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w, exact)
        return
    assert got == want


def _run(fn, make_args, inner="eager", calls=2):
    """fn eagerly, with ferrodyn (CountingBackend(inner)) and with torch.compile, `calls` times
    on fresh equal arguments: ferrodyn's results and gradients must be eager's. Returns
    (ferrodyn backend, torch.compile backend)."""
    ours, theirs = CountingBackend(inner), CountingBackend()
    torch._dynamo.reset()
    results = {}
    for name, f in (("eager", fn), ("ferrodyn", ferrodyn.compile(fn, backend=ours)),
                    ("torch", torch.compile(fn, backend=theirs))):
        runs = []
        for _ in range(calls):
            args = make_args()
            out = f(*args)
            runs.append((out, _grads(out, args)))
        results[name] = runs
    torch._dynamo.reset()
    for got, want in zip(results["ferrodyn"], results["eager"]):
        _same(got, want, exact=inner == "eager")
    return ours, theirs


def _captured(backend, cls) -> bool:
    return any(getattr(n.target, "autograd_function", None) is cls
               for gm in backend.graphs for n in gm.graph.nodes)


def _x(*shape, grad=True):
    def make():
        torch.manual_seed(0)
        return (torch.randn(*shape, requires_grad=grad),)
    return make


# ---- captured ------------------------------------------------------------------------------------

class STENet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return RoundSTE.apply(self.lin(x) * 3) * 2 + x


def test_ste_in_module_is_one_graph():
    torch.manual_seed(0)
    net = STENet()
    ours, theirs = _run(net, _x(2, 4))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, RoundSTE)
    params = [p.grad for p in net.parameters()]
    assert all(p is None for p in params)  # torch.autograd.grad, not .backward()


def test_save_for_backward_and_ctx_attributes():
    ours, theirs = _run(lambda x: ScaledGelu.apply(x.sin(), 0.5).cos(), _x(3, 5))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, ScaledGelu)


def test_setup_context_style_with_two_outputs():
    def make():
        torch.manual_seed(1)
        return torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)

    def fn(x, y):
        p, s = MulAdd.apply(x, y * 2)
        return p * s, s

    ours, theirs = _run(fn, make)
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, MulAdd)


@pytest.mark.parametrize("flip,nothing", [(True, None), (False, 3)])
def test_non_tensor_arguments(flip, nothing):
    def fn(x):
        return WithConstants.apply(x, 2, 0.25, flip, nothing, (0,)) + 1

    ours, theirs = _run(fn, _x(3, 2))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, WithConstants)


@pytest.mark.parametrize("grad", [True, False])
def test_under_no_grad_and_with_requires_grad_inputs(grad):
    def fn(x):
        with torch.no_grad():
            a = ScaledGelu.apply(x, 2.0)
        b = ScaledGelu.apply(x, 3.0)
        return a, b, a + b

    ours, theirs = _run(fn, _x(5, grad=grad))
    assert ours.count <= theirs.count
    assert _captured(ours, ScaledGelu)


def test_mark_non_differentiable_output():
    def fn(x):
        vals, idx = TopWithIndex.apply(x)
        return vals.sum(-1), idx, vals.gather(-1, idx.unsqueeze(-1))

    ours, theirs = _run(fn, _x(3, 4))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, TopWithIndex)


gelu = ScaledGelu.apply  # a stored bound apply (as transformers' and timm's modules keep them)


def test_stored_bound_apply():
    ours, theirs = _run(lambda x: gelu(x + 1, 1.5) * 2, _x(6))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, ScaledGelu)


@pytest.mark.parametrize("inner", ["aot_eager", "inductor"])
def test_aot_backends_give_eager_values_and_gradients(inner):
    def fn(x, y):
        p, s = MulAdd.apply(ScaledGelu.apply(x, 0.5), y)
        return Doubler.apply(p) + s

    def make():
        torch.manual_seed(2)
        return torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True)

    ours, theirs = _run(fn, make, inner=inner)
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, Doubler)


class PermuteNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.dims = (1, 0)
        self.scale = 0.5

    def forward(self, x):
        return ScaledGelu.apply(x.permute(self.dims), self.scale) + OnceDiff.apply(x).t()


def test_arguments_from_module_attributes_and_once_differentiable():
    ours, theirs = _run(PermuteNet(), _x(3, 2))
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, ScaledGelu) and _captured(ours, OnceDiff)


def test_list_argument_left_unchanged_is_captured():
    def fn(x, dims):
        return ListArg.apply(x, dims, False), dims

    def make():
        torch.manual_seed(3)
        return torch.randn(2, 3, requires_grad=True), [1, 0]

    ours, theirs = _run(fn, make)
    assert ours.count == 1 <= theirs.count
    assert _captured(ours, ListArg)


def test_list_argument_mutated_by_forward_breaks():
    def fn(x, dims):
        return ListArg.apply(x * 1, dims, True) + 1, dims

    def make():
        torch.manual_seed(3)
        return torch.randn(2, 3, requires_grad=True), [1, 0]

    ours, theirs = _run(fn, make, calls=1)
    assert not _captured(ours, ListArg)


def test_dynamic_shapes():
    fn = lambda x: ScaledGelu.apply(x, 2.0) * x.shape[0]
    backend = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=backend, dynamic=True)
    for n in (3, 5, 7):
        got_x, want_x = _x(n)()[0], _x(n)()[0]
        got, want = compiled(got_x), fn(want_x)
        _same(got, want, exact=True)
        _same(_grads(got, (got_x,)), _grads(want, (want_x,)), exact=True)
    assert backend.count == 1 and _captured(backend, ScaledGelu)


# ---- recompiles ----------------------------------------------------------------------------------

ACT = Doubler


def test_swapping_the_function_class_recompiles():
    global ACT

    def fn(x):
        return ACT.apply(x) + 1

    backend = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=backend)
    try:
        for cls, calls in ((Doubler, 2), (Tripler, 2), (Doubler, 1)):
            ACT = cls
            for _ in range(calls):
                got_x, want_x = _x(4)()[0], _x(4)()[0]
                got, want = compiled(got_x), fn(want_x)
                _same(got, want, exact=True)
                _same(_grads(got, (got_x,)), _grads(want, (want_x,)), exact=True)
    finally:
        ACT = Doubler
    assert backend.count == 2
    assert _captured(backend, Doubler) and _captured(backend, Tripler)


# ---- refused: the call breaks the graph, values stay eager's -------------------------------------

def _around(cls):
    def fn(x):
        y = x.sin()
        z = cls.apply(y)
        return z.cos() + y
    return fn


def test_forward_that_prints_breaks(capsys):
    ours, theirs = _run(_around(Printing), _x(3))
    assert not _captured(ours, Printing)
    assert 1 <= ours.count <= theirs.count
    assert capsys.readouterr().out.count("forward ran") == 6  # eager, ferrodyn, torch x2


def test_forward_that_mutates_a_global_breaks():
    # torch.compile captures this Function and replays the append after its graph; ferrodyn
    # refuses (its graph runs the real apply, which would append at the wrong point): the
    # frame breaks at the call (2 graphs) and the eager forward frame is captured on its own.
    LOG.clear()
    ours, theirs = _run(_around(GlobalMutation), _x(3), calls=1)
    assert LOG == [1] * 3
    assert not _captured(ours, GlobalMutation)
    assert ours.count == 3 and theirs.count == 1


def test_forward_reading_a_global_tensor_breaks():
    ours, theirs = _run(_around(ReadsGlobalTensor), _x(3))
    assert not _captured(ours, ReadsGlobalTensor)


def test_fullgraph_names_the_refused_function():
    fn = ferrodyn.compile(_around(Printing), backend="eager", fullgraph=True)
    with pytest.raises(ferrodyn.Unsupported, match="Printing.apply"):
        fn(torch.randn(3))


def test_effect_under_needs_input_grad_in_no_grad_breaks():
    def fn(x):
        y = x.sin()
        with torch.no_grad():
            z = LogsWhenGradNeeded.apply(y)
        return z + 1

    LOG.clear()
    ours, theirs = _run(fn, _x(3), calls=1)
    assert LOG == ["needs grad"] * 3
    assert not _captured(ours, LogsWhenGradNeeded)

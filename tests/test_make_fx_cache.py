"""Repeated make_fx traces in one process: every trace equals torch's make_fx on the same
inputs, whatever earlier traces left in the caches.

The caches a trace meets: torch's FakeTensorMode dispatch cache (process-wide for ops without
symbolic inputs, per ShapeEnv otherwise), which make_fx feeds the trace's one fake of each
parameter (`mode._fake_call_args`) so that ops on parameters hit it; the per-process op facts
(`mode.op_info`, with a per-device-type backend answer); the shared fake mode of real-mode
example values (`tracker._shared_val_mode`); the per-trace fakes of real tensors
(`tracker.fake_of`). A cache that kept anything across traces keyed on less than what decides
the result (shape, dtype, stride, device, requires_grad, a parameter changed in place, the
ShapeEnv's state) would make one of these traces differ from torch's. A fake op's result
reused across ShapeEnvs is observable too, even where the ShapeEnv's whole state matched: the
second trace of `contiguous_t` then names its nodes differently from torch's make_fx (the
reused output skips SymInt arithmetic that torch's trace records and later drops as dead), so
`test_repeated_traces_match_torch` fails for such a cache.

Each comparison with torch: the generated code (node names and order included), every node's
meta keys, `meta["val"]` (type, shape, stride, dtype, device, requires_grad, storage offset)
and `meta["tensor_meta"]`, and in symbolic mode the ShapeEnv's guards (in order) and
replacements.
"""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx as torch_make_fx

from ferrodyn.proxy_dispatch import make_fx

MODES = ("real", "fake", "symbolic")


def describe(v):
    if isinstance(v, torch.Tensor):
        return (type(v).__name__, str(v.shape), str(v.stride()), v.dtype, v.device,
                str(v.storage_offset()), v.requires_grad)
    if isinstance(v, (list, tuple)):
        return type(v).__name__, [describe(x) for x in v]
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return type(v).__name__, str(v)
    return type(v).__name__, v if isinstance(v, (int, float, bool, type(None))) else None


def shape_env_state(gm):
    env = getattr(gm, "shape_env", None)
    if env is None:
        return None
    return ([str(g.expr) for g in env.guards],
            sorted((str(k), str(v)) for k, v in env.replacements.items()))


def assert_same_as_torch(fn, args, mode):
    torch.manual_seed(0)
    ours = make_fx(fn, tracing_mode=mode)(*args)
    torch.manual_seed(0)
    ref = torch_make_fx(fn, tracing_mode=mode, _allow_non_fake_inputs=True)(*args)
    assert ours.code == ref.code
    got = [node_record(n) for n in ours.graph.nodes]
    want = [node_record(n) for n in ref.graph.nodes]
    assert got == want
    if mode == "symbolic":
        assert shape_env_state(ours) == shape_env_state(ref)
    return ours


def node_record(n):
    return (n.name, n.op, str(n.target), sorted(n.meta), describe(n.meta.get("val")),
            str(n.meta.get("tensor_meta")))


# -- the same program traced again --------------------------------------------------------------

torch.manual_seed(99)
_same_layers = torch.nn.Sequential(
    torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6), torch.nn.ReLU(),
    torch.nn.Linear(6, 6),
)


_row = torch.randn(1, 5, 5)
_square = torch.randn(5, 5)


def param_views_twice(x):
    # ops on closed-over tensors with symbolic arguments, twice: the second hits the fake
    # mode's cache (make_fx hands it the trace's one fake of the tensor) where torch's tracer
    # converts the real tensor again; and a node's symbolic arguments are made before the
    # get_attr of a constant argument, as torch's tracer makes them
    n = x.shape[0]
    a = _row.expand(n, 5, 5).contiguous() * 2
    b = _row.expand(n, 5, 5).contiguous() * 3
    c = _square.narrow(0, 0, n - 2).t().contiguous() + 1
    d = _square.narrow(0, 0, n - 2).t().contiguous() * 2
    return a, b, c, d


def layouts(x):
    # memory formats of static-size tensors (tensor_meta of those is memoised per sizes and
    # strides): channels_last (2d and 3d), permuted, expanded (stride 0), size-1 and empty dims
    cl = x.contiguous(memory_format=torch.channels_last)
    cl3 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last_3d)
    return (cl * 2, cl3 + 1, x.permute(0, 2, 3, 1) + 1, x[:, :1].expand(2, 3, 4, 5) * 1,
            x.new_zeros(0, 3), x[:, :, :1, :1].sum(0), x[0, 0].t())


def literal_constant(x):
    # torch.tensor(...) in the traced function: lift_fresh, recorded as lift_fresh_copy
    return x * torch.tensor([2.0, 3.0, 4.0]) + 1


def contiguous_t(x):
    y = x.t().contiguous()
    return y * 2, y.sum(0)


def same_layers(x):
    return _same_layers(x)


def views_and_sizes(x):
    n = x.shape[0]
    y = x.reshape(-1).view(n, -1)
    return y.new_zeros(n, 3), y.transpose(0, 1).flatten(), x.numel() * y


REPEATED = {
    "param_views_twice": (param_views_twice, lambda: (torch.randn(5, 5),)),
    "contiguous_t": (contiguous_t, lambda: (torch.randn(8, 5),)),
    "literal_constant": (literal_constant, lambda: (torch.randn(4, 3),)),
    "layouts": (layouts, lambda: (torch.randn(2, 3, 4, 5),)),
    "same_layers": (same_layers, lambda: (torch.randn(4, 6),)),
    "views_and_sizes": (views_and_sizes, lambda: (torch.randn(4, 6),)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(REPEATED))
def test_repeated_traces_match_torch(name, mode):
    fn, make_args = REPEATED[name]
    states = [shape_env_state(assert_same_as_torch(fn, make_args(), mode)) for _ in range(3)]
    assert states[1] == states[0] and states[2] == states[0]


# -- inputs changed between traces --------------------------------------------------------------

def shape_sensitive(x):
    y = (x.t() @ x).relu()
    return y.sum(0) + x.new_ones(x.shape[1]), y.contiguous().view(-1)[:3]


def _input_variants():
    base = torch.randn(5, 3)
    grad = torch.randn(4, 3, requires_grad=True)
    return [
        ("f32", base),
        ("other rows", torch.randn(6, 3)),
        ("f32 again", base.clone()),
        ("f64", base.double()),
        ("transposed storage", torch.randn(3, 5).t()),
        ("offset view", torch.randn(7, 3)[2:]),
        ("requires_grad", grad),
        ("f32 last", torch.randn(5, 3)),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_changed_inputs_between_traces(mode):
    variants = _input_variants()
    first = shape_env_state(assert_same_as_torch(shape_sensitive, (variants[0][1],), mode))
    for what, x in variants:
        gm = assert_same_as_torch(shape_sensitive, (x,), mode)
        # the graph computes what eager computes on that input
        got, want = gm(x.detach()), shape_sensitive(x.detach())
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, what
            torch.testing.assert_close(g, w)
    again = shape_env_state(assert_same_as_torch(shape_sensitive, (variants[0][1],), mode))
    assert again == first


@pytest.mark.parametrize("mode", ("fake", "symbolic"))
def test_meta_device_input_between_cpu_traces(mode):
    x = torch.randn(5, 3)
    assert_same_as_torch(shape_sensitive, (x,), mode)
    assert_same_as_torch(shape_sensitive, (torch.empty(5, 3, device="meta"),), mode)
    assert_same_as_torch(shape_sensitive, (x,), mode)


@pytest.mark.parametrize("mode", MODES)
def test_int_inputs_between_traces(mode):
    def f(x, n):
        return x.repeat(n, 1) * n, x.new_full((n,), 2.0)

    states = {}
    for n in (3, 4, 3, 1, 4):
        gm = assert_same_as_torch(f, (torch.randn(2, 3), n), mode)
        assert states.setdefault(n, shape_env_state(gm)) == shape_env_state(gm)


# -- parameters changed between traces ----------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_parameter_changed_between_traces(mode):
    torch.manual_seed(5)
    lin = torch.nn.Linear(3, 4)

    def f(x):
        return lin(x).relu(), lin.weight.t() * 2, lin.weight.requires_grad

    x = torch.randn(2, 3)
    assert_same_as_torch(f, (x,), mode)
    lin.weight.requires_grad_(False)  # same tensor object, autograd flag changed
    assert_same_as_torch(f, (x,), mode)
    lin.weight.requires_grad_(True)
    with torch.no_grad():  # same parameter objects, new sizes
        lin.weight.data = torch.randn(7, 3)
        lin.bias.data = torch.randn(7)
    gm = assert_same_as_torch(f, (x,), mode)
    assert gm(x)[0].shape == (2, 7)
    lin.double()  # new dtype
    assert_same_as_torch(f, (x.double(),), mode)


# -- the ShapeEnv's state differs between traces of the same ops ---------------------------------

def test_shape_env_state_changed_between_traces():
    specialise = [False]

    def f(x):
        if specialise[0]:
            torch._check(x.shape[0] == 8)  # a replacement s -> 8 before the same ops
        y = x.t().contiguous()
        return y * 2, y.sum(0), x.new_zeros(x.shape[0] * 2)

    x = torch.randn(8, 5)
    states = []
    for flag in (False, True, False, True):
        specialise[0] = flag
        gm = assert_same_as_torch(f, (x,), "symbolic")
        states.append(shape_env_state(gm))
    assert states[0] == states[2] and states[1] == states[3] and states[0] != states[1]

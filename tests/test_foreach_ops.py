"""Ops given a 0-d tensor where their schema takes a Scalar (variables/tensor_rewrites.py):
`torch._foreach_lerp_(xs, ys, torch.tensor(0.5))`, `x.addcmul_(y, z, value=t)`,
`torch._foreach_pow(t, exps)`. Eager converts the tensor with `.item()`; the fake run cannot,
so such calls made the whole frame eager. Found by PyTorch's test/dynamo/test_functions.py
(test_foreach_lerp_, test_broadcast_foreach_pow, test_addcmul_) run through ferrodyn.

Each case compares ferrodyn with eager bit for bit (results and the mutated inputs, on sizes
with vector tails, weights on both sides of lerp's 0.5 switch), the aliasing eager gives (an
in-place op returns its own inputs: `torch._foreach_lerp_(xs, ...) is xs`), and the graph count
with torch.compile's. Refused cases (a cast eager would make differently, autograd recording the
call) run eagerly with eager's values and errors."""

import copy

import pytest
import torch

import ferrodyn
from compiled_vs_eager import same
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def foreach_lerp_(xs, ys, w):
    return torch._foreach_lerp_(xs, ys, w)


def foreach_lerp(xs, ys, w):
    return torch._foreach_lerp(xs, ys, w)


def foreach_pow_scalar_base(s, exps):
    return torch._foreach_pow(s, exps)


def addcmul_(x, y, z, s):
    return x.addcmul_(y, z, value=s)


def addcdiv_(x, y, z, s):
    return x.addcdiv_(y, z, value=s)


def addcmul_fn(x, y, z, s):
    return torch.addcmul(x, y, z, value=s) * 2


def lerp_method(x, y, w):
    return x.lerp(y, w) + 1


def addcmul_unbound(x, y, z, s):
    return torch.Tensor.addcmul_(x, y, z, value=s)


def foreach_addcmul_(xs, ys, zs, s):
    torch._foreach_addcmul_(xs, ys, zs, value=s)
    return xs[0] + 1


def foreach_addcdiv(xs, ys, zs, s):
    return torch._foreach_addcdiv(xs, ys, zs, value=s)


def foreach_add_(xs, s):
    return torch._foreach_add_(xs, s)


def foreach_sub(xs, s):
    return torch._foreach_sub(xs, s)


def adam_like(params, grads, exp_avgs, exp_avg_sqs, beta1, beta2, step_size):
    """The ops of Adam's foreach step with tensor betas (torch/optim/adam.py)."""
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, 1e-8)
    torch._foreach_addcdiv_(params, exp_avgs, denom, value=step_size)
    return params


def _r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def _lists(n, seed, dtype=torch.float32):
    return [_r(37, dtype=dtype, seed=seed), _r(5, 7, dtype=dtype, seed=seed + 1)][:n]


CASES = {
    "foreach_lerp_small_weight": (foreach_lerp_, lambda: (_lists(2, 0), _lists(2, 5),
                                                          torch.tensor(0.3))),
    "foreach_lerp_large_weight": (foreach_lerp_, lambda: (_lists(2, 0), _lists(2, 5),
                                                          torch.tensor(0.8))),
    "foreach_lerp_tuple": (foreach_lerp_, lambda: (tuple(_lists(2, 0)), _lists(2, 5),
                                                   torch.tensor(0.5))),
    "foreach_lerp_f64": (foreach_lerp_, lambda: (_lists(2, 0, torch.float64),
                                                 _lists(2, 5, torch.float64),
                                                 torch.tensor(0.7, dtype=torch.float64))),
    "foreach_lerp_functional": (foreach_lerp, lambda: (_lists(2, 0), _lists(2, 5),
                                                       torch.tensor(0.6))),
    "foreach_pow_scalar_base": (foreach_pow_scalar_base, lambda: (
        torch.tensor(0.8), [torch.tensor(3.4), torch.tensor(7.8)])),
    "foreach_pow_f64_base": (foreach_pow_scalar_base, lambda: (
        torch.tensor(1.3, dtype=torch.float64), [_r(37), torch.tensor(7.8)])),
    "foreach_pow_int_base": (foreach_pow_scalar_base, lambda: (
        torch.tensor(3), [_r(37), torch.arange(5)])),
    "addcmul_": (addcmul_, lambda: (_r(37), _r(37, seed=1), _r(37, seed=2), torch.tensor(0.3))),
    "addcmul_broadcast": (addcmul_, lambda: (_r(5, 7), _r(7, seed=1), _r(5, 1, seed=2),
                                             torch.tensor(-1.7))),
    "addcmul_int_scalar": (addcmul_, lambda: (_r(37), _r(37, seed=1), _r(37, seed=2),
                                              torch.tensor(3))),
    "addcmul_int_tensors": (addcmul_, lambda: (torch.arange(9), torch.arange(9) - 4,
                                               torch.arange(9) * 3, torch.tensor(-2))),
    "addcmul_unbound_method": (addcmul_unbound, lambda: (_r(37), _r(37, seed=1),
                                                          _r(37, seed=2), torch.tensor(0.3))),
    "addcdiv_": (addcdiv_, lambda: (_r(37), _r(37, seed=1), _r(37, seed=2), torch.tensor(0.3))),
    "addcmul_functional": (addcmul_fn, lambda: (_r(37), _r(37, seed=1), _r(37, seed=2),
                                                torch.tensor(0.3))),
    "lerp_method": (lerp_method, lambda: (_r(37), _r(37, seed=1), torch.tensor(0.9))),
    "foreach_addcmul_": (foreach_addcmul_, lambda: (_lists(2, 0), _lists(2, 3), _lists(2, 6),
                                                    torch.tensor(0.1))),
    "foreach_addcdiv": (foreach_addcdiv, lambda: (_lists(2, 0), _lists(2, 3), _lists(2, 6),
                                                  torch.tensor(0.1))),
    "foreach_add_": (foreach_add_, lambda: (_lists(2, 0), torch.tensor(0.7))),
    "foreach_add_f64_scalar": (foreach_add_, lambda: (_lists(2, 0),
                                                      torch.tensor(1e-8, dtype=torch.float64))),
    "foreach_add_bf16": (foreach_add_, lambda: (_lists(2, 0, torch.bfloat16),
                                                torch.tensor(0.3))),
    "foreach_add_int": (foreach_add_, lambda: ([torch.arange(5), torch.arange(3)],
                                               torch.tensor(4))),
    "foreach_sub": (foreach_sub, lambda: (_lists(2, 0), torch.tensor(-2.5))),
    "adam_like": (adam_like, lambda: ([_r(37), _r(5, 7, seed=1)], _lists(2, 2),
                                      [torch.zeros(37), torch.zeros(5, 7)],
                                      [torch.zeros(37), torch.zeros(5, 7)],
                                      torch.tensor(0.9), torch.tensor(0.999),
                                      torch.tensor(-1e-3))),
}


def _run(fn, args):
    try:
        return fn(*args), None
    except Exception as e:
        return None, type(e)


def _compare(fn, make_args, compiled_counts=True):
    """Eager vs ferrodyn vs torch.compile on copies of the same arguments; the arguments after
    the call (mutated in place) are compared too. Returns (ferrodyn graphs, torch graphs,
    ferrodyn's result, its arguments)."""
    torch._dynamo.reset()
    base = make_args()
    eager_args, fd_args, tc_args = (copy.deepcopy(base) for _ in range(3))
    want, want_exc = _run(fn, eager_args)
    fd, tc = CountingBackend(), CountingBackend()
    got, got_exc = _run(ferrodyn.compile(fn, backend=fd), fd_args)
    _run(torch.compile(fn, backend=tc), tc_args)
    torch._dynamo.reset()
    assert got_exc is want_exc
    assert same(want, got), (want, got)
    assert same(eager_args, fd_args), "the mutated arguments differ from eager's"
    return fd.count, tc.count, got, fd_args


@pytest.mark.parametrize("name", sorted(CASES))
def test_scalar_tensor_ops_captured(name):
    fn, make_args = CASES[name]
    fd, tc, _, _ = _compare(fn, make_args)
    assert fd == 1, f"ferrodyn made {fd} graphs"
    assert fd <= max(tc, 1), (fd, tc)
    reasons = ferrodyn.explain(fn)(*make_args()).break_reasons
    assert reasons == [], reasons


def test_inplace_foreach_returns_its_input_list():
    """`torch._foreach_lerp_(xs, ...)` returns `xs` itself, whose tensors were mutated."""
    def f(xs, ys, w):
        out = torch._foreach_lerp_(xs, ys, w)
        return out is xs, out[0] is xs[0], out
    xs = _lists(2, 0)
    ids = [id(t) for t in xs]
    fd, _, got, fd_args = _compare(f, lambda: (_lists(2, 0), _lists(2, 5), torch.tensor(0.25)))
    assert fd == 1
    assert got[0] is True and got[1] is True
    assert got[2] is fd_args[0] and ids  # the caller's own list comes back


def test_inplace_method_returns_self():
    def f(x, y, z, s):
        r = x.addcmul_(y, z, value=s)
        return r is x, r
    fd, _, got, fd_args = _compare(f, lambda: (_r(37), _r(37, seed=1), _r(37, seed=2),
                                               torch.tensor(0.3)))
    assert fd == 1 and got[0] is True and got[1] is fd_args[0]


def test_recompiles_when_the_scalar_changes_value_not():
    """The 0-d tensor is a graph input, not a constant: new values reuse the graph."""
    fd = CountingBackend()
    f = ferrodyn.compile(addcmul_, backend=fd)
    for v in (0.3, -2.5, 7.0):
        args = (_r(37), _r(37, seed=1), _r(37, seed=2), torch.tensor(v))
        want = addcmul_(*copy.deepcopy(args))
        assert torch.equal(f(*args), want)
    assert fd.count == 1


REFUSED = {
    # eager's Scalar conversion raises on a float64 that overflows float32; a cast would not
    "f64_overflow": (addcmul_, lambda: (_r(3), _r(3), _r(3),
                                        torch.tensor(1e300, dtype=torch.float64))),
    # a float64 scalar with float32 tensors: refused rather than cast (see _cast_is_exact)
    "f64_into_f32": (addcmul_, lambda: (_r(3), _r(3), _r(3),
                                        torch.tensor(0.1, dtype=torch.float64))),
    # eager raises for a float value with integer tensors
    "float_value_int_tensors": (addcmul_, lambda: (torch.arange(3), torch.arange(3),
                                                   torch.arange(3), torch.tensor(0.5))),
    "float_value_int_tensors_fn": (addcmul_fn, lambda: (torch.arange(3), torch.arange(3),
                                                        torch.arange(3), torch.tensor(0.5))),
    # bfloat16 computes in float32 inside the kernel: s * t1 in bfloat16 would round
    "bf16": (addcmul_, lambda: (_r(37).bfloat16(), _r(37, seed=1).bfloat16(),
                                _r(37, seed=2).bfloat16(), torch.tensor(0.3))),
    # eager raises: a float Scalar added in place to integer tensors
    "foreach_add_float_into_int": (foreach_add_, lambda: ([torch.arange(5)], torch.tensor(0.5))),
    # mixed dtypes: the kernel computes in float64, s * t1 would round in float32
    "mixed_dtypes": (addcmul_, lambda: (_r(3, dtype=torch.float64), _r(3), _r(3),
                                        torch.tensor(0.3))),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_rewrites_keep_eager_values(name):
    fn, make_args = REFUSED[name]
    fd, tc, _, _ = _compare(fn, make_args)
    assert fd <= max(tc, 1)


def test_autograd_recording_call_is_not_rewritten():
    """Under grad mode with inputs requiring grad the rewrite would change the backward
    (`grad * (t2 * value)` becomes `(grad * t2) * value`), so the call is refused: values and
    gradients are eager's."""
    def f(x, y, z, s):
        return torch.addcmul(x, y, z, value=s).sum()

    def make():
        return (_r(37).requires_grad_(), _r(37, seed=1).requires_grad_(), _r(37, seed=2),
                torch.tensor(0.3))
    a, b = make(), make()
    fd = CountingBackend()
    want = f(*a)
    want.backward()
    got = ferrodyn.compile(f, backend=fd)(*b)
    got.backward()
    assert same(want, got)
    for u, v in zip(a[:2], b[:2]):
        assert same(u.grad, v.grad)


def test_scalar_requiring_grad_raises_as_eager():
    """A 0-d tensor that requires grad is no Number to eager (TypeError), even under no_grad."""
    def f(x, s):
        with torch.no_grad():
            return x.addcmul_(x, x, value=s)
    fd, tc, _, _ = _compare(f, lambda: (_r(3), torch.tensor(0.3, requires_grad=True)))
    assert fd <= max(tc, 1)

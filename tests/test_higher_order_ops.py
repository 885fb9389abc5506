"""Higher-order ops with traced bodies (variables/higher_order.py, higher_order_ops.py):
`torch.utils.checkpoint.checkpoint` captured as `tag_activation_checkpoint` and `torch.cond` as
`cond`, compiled vs eager (values and gradients), graph counts vs torch.compile's, guards on
what the body reads, and refusals (bodies with effects break the graph, values stay eager's)."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

TAG_AC = torch.ops.higher_order.tag_activation_checkpoint
COND = torch.ops.higher_order.cond

lin = torch.nn.Linear(4, 4)
w = torch.randn(4)
log: list = []


def body(x, y, scale=1.0):
    return torch.sin(lin(x)) * w + y * scale


def hop_targets(cb):
    return [n.target for g in cb.graphs for n in g.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)]


def grads_of(fn, inputs, params):
    for t in (*inputs, *params):
        t.grad = None
    out = fn(*inputs)
    loss = sum(o.sum() for o in out) if isinstance(out, (tuple, list)) else out.sum()
    loss.backward()
    return out, [t.grad.clone() if t.grad is not None else None for t in (*inputs, *params)]


def check(fn, make_inputs, params=(), inner="eager", grads=True):
    """Compiled vs eager (values, and gradients of inputs and params), graph counts vs
    torch.compile's; returns ferrodyn's CountingBackend."""
    inputs = make_inputs()
    if grads:
        eager, eager_grads = grads_of(fn, inputs, params)
    else:
        eager = fn(*inputs)
    torch._dynamo.reset()
    tcb, fcb = CountingBackend(inner), CountingBackend(inner)
    torch.compile(fn, backend=tcb)(*make_inputs())
    if grads:
        got, got_grads = grads_of(ferrodyn.compile(fn, backend=fcb), inputs, params)
        for a, b in zip(eager_grads, got_grads):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a)
    else:
        got = ferrodyn.compile(fn, backend=fcb)(*inputs)
    torch.testing.assert_close(got, eager)
    assert fcb.count == tcb.count, (fcb.count, tcb.count)
    return fcb


def _xy():
    torch.manual_seed(0)
    return torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)


# ---- checkpoint ---------------------------------------------------------------------------------

@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_checkpoint_values_grads_and_node(inner):
    reentrant = False

    def fn(x, y):
        return checkpoint(body, x.cos(), y, use_reentrant=reentrant) + 1

    cb = check(fn, _xy, params=(lin.weight, lin.bias), inner=inner)
    assert cb.count == 1
    assert hop_targets(cb) == [TAG_AC]
    node = next(n for n in cb.graphs[0].graph.nodes if n.target is TAG_AC)
    assert node.args[0].op == "get_attr"
    assert isinstance(getattr(cb.graphs[0], node.args[0].target), torch.fx.GraphModule)
    assert node.kwargs == {"use_reentrant": reentrant}


def test_checkpoint_kwargs_for_fn_and_tuple_output():
    def two(x, y, scale=1.0):
        return x * scale, (y.sin() * w, None)

    def fn(x, y):
        a, (b, c) = checkpoint(two, x, y, scale=3.0, use_reentrant=False, preserve_rng_state=True)
        return a + b if c is None else a

    check(fn, _xy)


def test_checkpoint_closure_of_frame_tensor():
    def fn(x, y):
        z = y * 2

        def inner(t):
            return (t * z).relu()
        return checkpoint(inner, x, use_reentrant=False)

    cb = check(fn, _xy)
    assert hop_targets(cb) == [TAG_AC]


def test_checkpoint_module_call():
    mod = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))

    def fn(x, y):
        return checkpoint(mod, x, use_reentrant=False) + y

    cb = check(fn, _xy, params=tuple(mod.parameters()))
    assert hop_targets(cb) == [TAG_AC]


def test_checkpoint_nested():
    def fn(x, y):
        def outer(t):
            return checkpoint(lambda u: (u * w).sin(), t.cos(), use_reentrant=False) * 2
        return checkpoint(outer, x, use_reentrant=False) + y

    cb = check(fn, _xy)
    assert hop_targets(cb) == [TAG_AC]
    sub = next(m for m in cb.graphs[0].children())
    assert [n.target for n in sub.graph.nodes if n.target is TAG_AC] == [TAG_AC]


def test_checkpoint_guards_recompile_on_global_tensor_shape():
    global w
    saved = w

    def fn(x, y):
        return checkpoint(lambda t: t * w, x, use_reentrant=False)

    try:
        cb = CountingBackend()
        cf = ferrodyn.compile(fn, backend=cb)
        x, y = _xy()
        torch.testing.assert_close(cf(x, y), fn(x, y))
        w = torch.randn(3, 1)  # a new shape: the guard on the lifted global fails
        torch.testing.assert_close(cf(x, y), fn(x, y))
        assert cb.count == 2
        torch.testing.assert_close(cf(x, y), fn(x, y))
        assert cb.count == 2
    finally:
        w = saved


def test_checkpoint_refuses_outer_list_mutation():
    def noisy(t):
        log.append(1)
        return t.sin()

    def fn(x, y):
        return checkpoint(noisy, x, use_reentrant=False) + y

    log.clear()
    inputs = _xy()
    eager = fn(*inputs)
    n_eager = len(log)
    cb = CountingBackend()
    got = ferrodyn.compile(fn, backend=cb)(*inputs)
    torch.testing.assert_close(got, eager)
    assert len(log) == 2 * n_eager  # the body ran (eagerly) once more
    assert TAG_AC not in hop_targets(cb)
    assert cb.count >= 2  # the graph broke at the checkpoint call


def test_checkpoint_refuses_mutating_list_made_in_frame():
    def fn(x, y):
        seen = []

        def inner(t):
            seen.append(t)
            return t.cos()
        out = checkpoint(inner, x, use_reentrant=False)
        return out + len(seen)

    inputs = _xy()
    cb = CountingBackend()
    got = ferrodyn.compile(fn, backend=cb)(*inputs)
    torch.testing.assert_close(got, fn(*inputs))
    assert TAG_AC not in hop_targets(cb)


def test_checkpoint_refuses_inplace_write_to_input():
    def fn(x, y):
        return checkpoint(lambda t: t.add_(1), y.detach(), use_reentrant=False) * 2

    _, y = _xy()
    y_eager, y_comp = y.detach().clone(), y.detach().clone()
    eager = fn(None, y_eager)
    cb = CountingBackend()
    got = ferrodyn.compile(fn, backend=cb)(None, y_comp)
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(y_comp, y_eager)  # the write reached the input, as in eager
    assert TAG_AC not in hop_targets(cb)


def test_checkpoint_refuses_random_body_keeps_eager_grads():
    drop = torch.nn.Dropout(0.5)

    def fn(x, y):
        return checkpoint(lambda t: drop(lin(t)), x, use_reentrant=False) * y

    x, y = _xy()
    torch.manual_seed(1)
    _, eager = grads_of(fn, (x, y), (lin.weight,))
    cb = CountingBackend()
    torch.manual_seed(1)
    _, got = grads_of(ferrodyn.compile(fn, backend=cb), (x, y), (lin.weight,))
    for a, b in zip(eager, got):
        torch.testing.assert_close(b, a)
    assert TAG_AC not in hop_targets(cb)


def test_checkpoint_eval_dropout_is_captured():
    drop = torch.nn.Dropout(0.5).eval()

    def fn(x, y):
        return checkpoint(lambda t: drop(lin(t)), x, use_reentrant=False) * y

    cb = check(fn, _xy, params=(lin.weight,))
    assert hop_targets(cb) == [TAG_AC]


def _reentrant_grad_reader(x, y):
    h = x * 2
    if torch.is_grad_enabled() or h.requires_grad:  # both False inside eager's reentrant body
        return h + y
    return h - y


@pytest.mark.parametrize("requires_grad", [True, False])
def test_checkpoint_reentrant_is_refused_and_keeps_eager_grad_mode_reads(requires_grad):
    def fn(x, y):
        return checkpoint(_reentrant_grad_reader, x, y, use_reentrant=True) * 3

    x = torch.randn(3, 4, requires_grad=requires_grad)
    y = torch.randn(3, 4)
    cb = CountingBackend()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = fn(x, y)
        out = ferrodyn.compile(fn, backend=cb)(x, y)
    torch.testing.assert_close(out, ref)  # the body saw no_grad: x*2 - y
    torch.testing.assert_close(out, (x * 2 - y) * 3)
    assert out.requires_grad is ref.requires_grad
    assert TAG_AC not in hop_targets(cb)


# ---- cond ---------------------------------------------------------------------------------------

def _cond_fn(x, y):
    return torch.cond(x.sum() > 0, lambda a: a.sin() * w, lambda a: a.cos() + y, (x,))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_values_grads_and_node(sign):
    def make():
        x, y = _xy()
        return (x.detach().abs().mul(sign).requires_grad_(), y)

    cb = check(_cond_fn, make)
    assert hop_targets(cb) == [COND]
    node = next(n for n in cb.graphs[0].graph.nodes if n.target is COND)
    assert [a.op for a in node.args[1:3]] == ["get_attr", "get_attr"]
    t, f = (getattr(cb.graphs[0], a.target) for a in node.args[1:3])
    assert len([n for n in t.graph.nodes if n.op == "placeholder"]) == len(node.args[3])
    assert len([n for n in f.graph.nodes if n.op == "placeholder"]) == len(node.args[3])


def test_cond_runs_both_branches_at_runtime():
    cb = CountingBackend()
    cf = ferrodyn.compile(_cond_fn, backend=cb)
    for sign in (1.0, -1.0, 1.0):
        x = torch.full((3, 4), sign)
        y = torch.randn(3, 4)
        torch.testing.assert_close(cf(x, y), _cond_fn(x, y))
    assert cb.count == 1


def test_cond_closure_and_tuple_outputs():
    def fn(x, y):
        k = y.mean()

        def t(a, b):
            return a + k, b * 2

        def f(a, b):
            return a - k, b.sin()
        p, q = torch.cond(x.mean() > y.mean(), t, f, [x, y])
        return p * q

    check(fn, _xy)


def test_cond_constant_predicate_inlines_branch():
    def fn(x, y):
        return torch.cond(True, lambda a: a * 2, lambda a: a * 3, (x,)) + y

    cb = check(fn, _xy)
    assert hop_targets(cb) == []


def test_cond_guards_recompile_on_closure_change():
    def make(scale):
        s = torch.full((4,), scale)

        def fn(x):
            return torch.cond(x.sum() > 0, lambda a: a * s, lambda a: a - s, (x,))
        return fn

    cb = CountingBackend()
    x = torch.ones(3, 4)
    for scale in (2.0, 5.0):
        fn = make(scale)
        torch.testing.assert_close(ferrodyn.compile(fn, backend=cb)(x), fn(x))
    s_shape = torch.ones(3, 4)
    fn = make(1.0)
    fn.__closure__[0].cell_contents = s_shape  # a new shape of the closure tensor
    torch.testing.assert_close(ferrodyn.compile(fn, backend=cb)(x), fn(x))


def test_cond_refuses_branch_mutating_outer_list():
    """Eager torch.cond refuses a branch with effects (it compiles its branches): the frame
    breaks at the call and eager's error is raised, not a captured mutation."""
    def fn(x, y):
        def t(a):
            log.append("t")
            return a.sin()
        return torch.cond(x.sum() > 0, t, lambda a: a.cos(), (x,)) + y

    x, y = torch.ones(3, 4), torch.randn(3, 4)
    with pytest.raises(Exception) as eager:
        fn(x, y)
    torch._dynamo.reset()
    log.clear()
    cb = CountingBackend()
    with pytest.raises(type(eager.value)):
        ferrodyn.compile(fn, backend=cb)(x, y)
    assert COND not in hop_targets(cb)


def test_cond_getitem_outputs_are_read():
    cb = check(_cond_fn, _xy, grads=False)
    g = cb.graphs[0]
    assert any(n.target is operator.getitem for n in g.graph.nodes)


FLAG = True


def test_checkpoint_guards_recompile_on_global_constant_read_in_body():
    global FLAG

    def inner(t):
        return t.sin() if FLAG else t.cos()

    def fn(x, y):
        return checkpoint(inner, x, use_reentrant=False) + y

    cb = CountingBackend()
    cf = ferrodyn.compile(fn, backend=cb)
    x, y = _xy()
    try:
        for flag in (True, False, True):
            FLAG = flag
            torch.testing.assert_close(cf(x, y), fn(x, y))
        assert cb.count == 2
        assert hop_targets(cb) == [TAG_AC, TAG_AC]
    finally:
        FLAG = True


def test_checkpoint_refuses_aten_random_op_and_print():
    def noisy(t):
        print("in body")
        return t.sin()

    def rnd(t):
        return torch.ops.aten.bernoulli(t.sigmoid()) * t

    for body_fn in (noisy, rnd):
        def fn(x, y):
            return checkpoint(body_fn, x, use_reentrant=False) + y

        cb = CountingBackend()
        x, y = _xy()
        torch.manual_seed(3)
        eager = fn(x, y)
        torch.manual_seed(3)
        torch.testing.assert_close(ferrodyn.compile(fn, backend=cb)(x, y), eager)
        assert TAG_AC not in hop_targets(cb)
        ferrodyn.reset()


def test_checkpoint_fullgraph_refusal_names_the_body():
    def fn(x, y):
        def inner(t):
            log.append(t)
            return t.sin()
        return checkpoint(inner, x, use_reentrant=False)

    with pytest.raises(ferrodyn.Unsupported, match="checkpoint body"):
        ferrodyn.compile(fn, backend=CountingBackend(), fullgraph=True)(*_xy())


# ---- while_loop, map ------------------------------------------------------------------------------

WHILE = torch.ops.higher_order.while_loop
MAP = torch.ops.higher_order.map_impl


def test_while_loop_values_and_node():
    from torch._higher_order_ops.while_loop import while_loop

    def fn(it, x):
        return while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * w + 1), (it, x))

    cb = check(fn, lambda: (torch.tensor(0), torch.randn(4)), grads=False)
    assert hop_targets(cb) == [WHILE]
    node = next(n for n in cb.graphs[0].graph.nodes if n.target is WHILE)
    cond_gm, body_gm = (getattr(cb.graphs[0], a.target) for a in node.args[:2])
    n_in = len(node.args[2]) + len(node.args[3])
    for gm in (cond_gm, body_gm):
        assert len([n for n in gm.graph.nodes if n.op == "placeholder"]) == n_in
    # the loop runs a data-dependent number of times at run time
    cf = ferrodyn.compile(fn, backend=CountingBackend())
    for start in (0, 2, 5):
        x = torch.randn(4)
        for a, b in zip(cf(torch.tensor(start), x), fn(torch.tensor(start), x)):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_map_values_grads_and_node(inner):
    from torch._higher_order_ops.map import map as hop_map

    def fn(xs, y):
        return hop_map(lambda x, b: (x * b + w).sin(), xs, y)

    cb = check(fn, lambda: (torch.randn(3, 4, requires_grad=True),
                            torch.randn(4, requires_grad=True)), inner=inner)
    assert hop_targets(cb) == [MAP]


def test_checkpoint_refuses_returning_outer_tensor_or_one_tensor_twice():
    def outer(x, y):
        z = y * 2
        a, b = checkpoint(lambda t: (t.sin(), z), x, use_reentrant=False)
        return a + b, b is z

    def twice(x, y):
        a, b = checkpoint(lambda t: (t.sin(),) * 2, x, use_reentrant=False)
        return a + b, a is b

    for fn in (outer, twice):
        cb = CountingBackend()
        x, y = _xy()
        (got, got_is), (exp, exp_is) = ferrodyn.compile(fn, backend=cb)(x, y), fn(x, y)
        torch.testing.assert_close(got, exp)
        assert got_is == exp_is
        assert TAG_AC not in hop_targets(cb)
        ferrodyn.reset()

"""tensor_match leaves and tensor_size/tensor_stride accessors (rust/tensor/spec.rs,
rust/guards/access.rs): every property true and false with its explanation, over many kinds of
tensors, on a mapping and on argument slots."""

import re

import pytest
import torch

from ferrodyn import _C


class Sub(torch.Tensor):
    pass


class Wrapper(torch.Tensor):
    """A __torch_dispatch__ wrapper subclass (Python dispatch key: the slow path)."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(),
                                                   dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def both(tree, value):
    """check and explain on a mapping and on slots (tuple and list); all must agree."""
    results = {tree.check({"x": value}), tree.check((value,)), tree.check([value])}
    assert len(results) == 1
    expl = {tree.explain({"x": value}), tree.explain((value,))}
    assert len(expl) == 1
    (ok,), (why,) = results, expl
    assert (why is None) == ok
    return ok, why


def match_tree(example, **kw):
    b = _C.GuardBuilder()
    b.tensor_match(b.local(0, "x"), example, **kw)
    return b.build()


def like(t):
    """A different tensor object with the same metadata as `t`."""
    u = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    if type(t) is torch.nn.Parameter:
        return torch.nn.Parameter(u, requires_grad=t.requires_grad)
    if type(t) is not torch.Tensor:
        u = u.as_subclass(type(t))
    if t.requires_grad:
        u.requires_grad_(True)
        if t.grad_fn is not None:
            u = u * 1
    return u


def _examples():
    a = torch.randn(4, 6, 8)
    leaf = torch.randn(3, 4, requires_grad=True)
    return {
        "contiguous": torch.randn(4, 6),
        "transposed": torch.randn(4, 6).t(),
        "sliced": a[1:, ::2, 3],
        "expanded (stride 0)": torch.randn(4, 1).expand(4, 5),
        "0-d": torch.tensor(2.5),
        "5-d": torch.randn(1, 2, 3, 2, 1),
        "6-d (out-of-line sizes)": torch.randn(2, 1, 2, 3, 1, 2),
        "8-d transposed": torch.randn(2, 1, 2, 1, 2, 1, 2, 3).transpose(1, 6),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "empty": torch.empty(0, 3),
        "parameter": torch.nn.Parameter(torch.randn(3, 3)),
        "parameter without grad": torch.nn.Parameter(torch.randn(3), requires_grad=False),
        "requires_grad leaf": leaf,
        "non-leaf (grad_fn)": leaf * 2,
        "view of requires_grad": leaf[1:],
        "subclass": torch.randn(2, 2).as_subclass(Sub),
        "meta device": torch.empty(3, 2, device="meta"),
        **{f"dtype {d}": torch.zeros(2, 3, dtype=d) for d in (
            torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32,
            torch.int64, torch.bool, torch.complex64)},
    }


EXAMPLES = _examples()


def test_fast_path_is_verified_on_this_torch():
    assert _C.tensor_fast_path() is True, _C._tensor_fast_path_failure()


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_matches_itself_and_a_lookalike(name):
    t = EXAMPLES[name]
    tree = match_tree(t)
    assert both(tree, t) == (True, None)
    assert both(tree, like(t)) == (True, None)
    expr = tree.leaves()[0]
    assert expr.startswith(f"tensor_match(L['x']: {type(t).__name__}, {t.dtype}, device={t.device}")


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_property_mismatch_fails_with_its_explanation(name):
    t = EXAMPLES[name]
    tree = match_tree(t)
    # dtype
    other = torch.float64 if t.dtype != torch.float64 else torch.float32
    u = torch.empty_strided(t.size(), t.stride(), dtype=other, device=t.device).as_subclass(type(t)) \
        if type(t) is Sub else torch.empty_strided(t.size(), t.stride(), dtype=other, device=t.device)
    if type(t) in (torch.Tensor, Sub) and not t.requires_grad:
        assert both(tree, u) == (False, f"L['x'].dtype == {t.dtype} (got {other})")
    # a size (and then ndim)
    if t.dim() and type(t) in (torch.Tensor, Sub) and not t.requires_grad:
        sizes = list(t.size())
        sizes[0] += 1
        u = torch.empty_strided(sizes, t.stride(), dtype=t.dtype, device=t.device)
        u = u.as_subclass(Sub) if type(t) is Sub else u
        assert both(tree, u) == (False, f"L['x'].size()[0] == {t.size(0)} (got {sizes[0]})")
        strides = list(t.stride())
        strides[-1] += 7
        u = torch.empty_strided(t.size(), strides, dtype=t.dtype, device=t.device)
        u = u.as_subclass(Sub) if type(t) is Sub else u
        d = t.dim() - 1
        assert both(tree, u) == (False, f"L['x'].stride()[{d}] == {t.stride(d)} (got {strides[-1]})")
    if type(t) is torch.Tensor and not t.requires_grad:
        u = torch.empty(*t.size(), 1, dtype=t.dtype, device=t.device)
        assert both(tree, u) == (False, f"L['x'].dim() == {t.dim()} (got {t.dim() + 1})")
    # type
    if type(t) is torch.Tensor:  # (Parameter(a Sub) keeps the type Sub)
        p = torch.nn.Parameter(like(t).detach(), requires_grad=False)
        assert both(tree, p) == (False, f"type(L['x']) is {type(t).__name__} (got Parameter)")
    assert both(tree, 3) == (False, f"type(L['x']) is {type(t).__name__} (got int)")
    # requires_grad
    if t.dtype.is_floating_point and type(t) is torch.Tensor and t.is_leaf:
        u = like(t).requires_grad_(not t.requires_grad)
        want, got = ("True", "False") if t.requires_grad else ("False", "True")
        assert both(tree, u) == (False, f"L['x'].requires_grad == {want} (got {got})")
    # device
    if type(t) is torch.Tensor and not t.requires_grad:
        dev = "cpu" if t.device.type == "meta" else "meta"
        u = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=dev)
        assert both(tree, u) == (False, f"L['x'].device == {t.device} (got {dev})")


def test_non_leaf_vs_leaf_requires_grad():
    leaf = torch.randn(3, requires_grad=True)
    y = leaf * 2
    tree = match_tree(torch.randn(3))
    assert both(tree, y) == (False, "L['x'].requires_grad == False (got True)")
    assert both(tree, y.detach()) == (True, None)
    assert both(match_tree(y), leaf.detach().clone().requires_grad_()) == (True, None)  # both True


def test_view_of_requires_grad_base_made_without_grad():
    base = torch.randn(4, 3, requires_grad=True)
    with torch.no_grad():
        v = base[1:]
    # No grad_fn and requires_grad_ unset, yet the view requires grad through its base.
    assert v.grad_fn is None and v.requires_grad is True
    tree = match_tree(torch.randn(3, 3))
    assert both(tree, v) == (False, "L['x'].requires_grad == False (got True)")
    assert both(match_tree(v), v) == (True, None)
    assert both(match_tree(v), v.detach()) == (False, "L['x'].requires_grad == True (got False)")


def test_dispatch_keys_mismatch_inference_tensor():
    with torch.inference_mode():
        inf = torch.randn(2, 2)
    normal = torch.randn(2, 2)
    assert torch._C._dispatch_keys(inf) != torch._C._dispatch_keys(normal)
    ok, why = both(match_tree(normal), inf)
    assert not ok
    assert re.fullmatch(r"L\['x'\] dispatch keys == DispatchKeySet\(.*\) \(got DispatchKeySet\(.*\)\)", why), why
    assert both(match_tree(inf), inf) == (True, None)


def test_subclass_is_not_tensor():
    t = torch.randn(2, 2)
    assert both(match_tree(t), t.as_subclass(Sub)) == (False, "type(L['x']) is Tensor (got Sub)")
    assert both(match_tree(t.as_subclass(Sub)), t) == (False, "type(L['x']) is Sub (got Tensor)")


def test_wrapper_subclass_uses_the_python_path():
    w = Wrapper(torch.randn(2, 3))
    tree = match_tree(w)
    assert both(tree, w) == (True, None)
    assert both(tree, Wrapper(torch.randn(3, 3))) == (False, "L['x'].size()[0] == 2 (got 3)")
    assert both(tree, torch.randn(2, 3)) == (False, "type(L['x']) is Wrapper (got Tensor)")


def test_dynamic_dims_skip_size_and_stride():
    t = torch.randn(4, 5)
    tree = match_tree(t, dynamic_dims=[0])
    assert tree.leaves()[0].endswith("size=[None, 5], stride=[None, 1])")
    assert both(tree, torch.randn(9, 5)) == (True, None)
    assert both(tree, torch.randn(9, 6)) == (False, "L['x'].size()[1] == 5 (got 6)")
    tree = match_tree(t, dynamic_dims=[-1])
    assert both(tree, torch.randn(4, 5)[:, :2]) == (True, None)
    assert both(tree, torch.randn(4, 2)) == (False, "L['x'].stride()[0] == 5 (got 2)")
    assert both(tree, torch.randn(3, 5)) == (False, "L['x'].size()[0] == 4 (got 3)")
    with pytest.raises(ValueError, match="out of range"):
        match_tree(t, dynamic_dims=[2])


def test_check_strides_false():
    t = torch.randn(4, 4)
    tree = match_tree(t, check_strides=False)
    assert tree.leaves()[0].endswith("stride=[None, None])")
    assert both(tree, torch.randn(4, 4).t()) == (True, None)
    assert both(match_tree(t), torch.randn(4, 4).t()) == (False, "L['x'].stride()[0] == 4 (got 1)")


def test_tensor_match_needs_a_tensor():
    b = _C.GuardBuilder()
    with pytest.raises(TypeError, match="needs a torch.Tensor"):
        b.tensor_match(b.local(0, "x"), [1, 2])


def test_tensor_leaves_run_last():
    b = _C.GuardBuilder()
    b.tensor_match(b.local(0, "x"), torch.randn(2))
    b.global_state()
    b.equals(b.local(1, "n"), 3)
    leaves = b.build().leaves()
    assert leaves[0] == "L['n'] == 3"
    assert leaves[1].startswith("global_state(") and leaves[2].startswith("tensor_match(")


# -- size / stride accessors -------------------------------------------------------------------

@pytest.mark.parametrize("t", [torch.randn(4, 6), torch.randn(4, 6).t(), torch.randn(2, 1, 2, 3, 1, 2).transpose(0, 3),
                               torch.randn(3, 4, requires_grad=True)[1:], Wrapper(torch.randn(5, 2)),
                               torch.randn(5, 7).as_subclass(Sub)])
def test_size_and_stride_accessors(t):
    for dim in range(-t.dim(), t.dim()):
        b = _C.GuardBuilder()
        x = b.local(0, "x")
        s, st = b.tensor_size(x, dim), b.tensor_stride(x, dim)
        assert (s.source, st.source) == (f"L['x'].size()[{dim}]", f"L['x'].stride()[{dim}]")
        b.equals(s, t.size(dim))
        b.equals(st, t.stride(dim))
        tree = b.build()
        assert both(tree, t) == (True, None)
    b = _C.GuardBuilder()
    b.equals(b.tensor_size(b.local(0, "x"), 0), t.size(0) + 1)
    assert both(b.build(), t) == (False, f"L['x'].size()[0] == {t.size(0) + 1} (got {t.size(0)})")


@pytest.mark.parametrize("value, dim", [(torch.randn(2), 1), (torch.randn(2), -2), (torch.tensor(1.0), 0), ([1, 2], 0), (None, 0)])
def test_size_accessor_failures(value, dim):
    b = _C.GuardBuilder()
    n = b.tensor_stride(b.local(0, "x"), dim)
    b.equals(n, 1)
    assert both(b.build(), value) == (False, f"L['x'].stride()[{dim}] == 1 (L['x'].stride()[{dim}] could not be read)")


def test_module_parameters_through_dict_of():
    m = torch.nn.Linear(3, 2)
    b = _C.GuardBuilder()
    self_ = b.local(0, "self")
    b.type_is(self_, torch.nn.Linear)
    params = b.item(b.dict_of(self_), "_parameters")
    w = b.item(params, "weight")
    assert w.source == "L['self'].__dict__['_parameters']['weight']"
    b.tensor_match(w, m.weight)
    b.tensor_match(b.item(params, "bias"), m.bias)
    tree = b.build()
    assert tree.check({"self": m}) and tree.check((m,))
    m2 = torch.nn.Linear(3, 2)
    assert tree.check((m2,))
    m2.weight.requires_grad_(False)
    assert tree.explain((m2,)) == "L['self'].__dict__['_parameters']['weight'].requires_grad == True (got False)"
    del m2._parameters["bias"]
    assert not tree.check((m2,))
    assert tree.explain((torch.nn.Linear(4, 2),)) == \
        "L['self'].__dict__['_parameters']['weight'].size()[1] == 3 (got 4)"

"""The replay plan's shortcuts (rust/guards/replay.rs `Plan`): tensor leaves checked from packed
copies of what they expect (dtype+device+policy word, key set, interleaved sizes/strides under
a bitmask, requires_grad), accessors applied to the same object read once (twin nodes), identical
leaves on the same object skipped, dict-keys leaves passed on an unchanged dict version, a
name->value locals dict remembered by its version, and identity leaves reading the weakref's
referent directly. Each test mutates exactly what a shortcut skips and checks that the replay
never passes where the full path fails, and that the compiled call gives eager's result."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch._dynamo

import ferrodyn
from ferrodyn import _C
from counting_backend import CountingBackend

# True where dict versions are read (3.11, 3.12); None on 3.13 (every replay defers there).
REPLAYED = None if _C._dict_version({}) is None else True


@pytest.fixture(autouse=True)
def _fresh(fresh_ferrodyn):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _agrees(tree, args, want=None):
    """The replay decides as the full path does (or defers); returns the full path's verdict."""
    replayed = tree._replay(args)
    full = tree._full_check(args)
    assert replayed in (None, full), (replayed, full)
    if want is not None:
        assert full is want
    return full


def _three(a, b, c):
    return a * 2 + b.sum() + c.sum()


def _in_place_mutations():
    def resize_same_ndim(a):
        a.resize_(5, 4).fill_(0.5)  # the grown part is uninitialised memory (a NaN there
                                    # made eager and compiled results compare unequal)

    def resize_to_fewer_elements(a):
        a.resize_(2, 3)

    def unsqueeze(a):
        a.unsqueeze_(0)

    def transpose_square(a):  # same sizes, other strides
        a.t_()

    def set_other_strides(a):
        a.set_(torch.zeros(64).untyped_storage(), 0, (4, 4), (8, 1))

    def requires_grad_on(a):
        a.requires_grad_(True)

    def data_other_dtype(a):
        a.data = torch.zeros(4, 4, dtype=torch.float64)

    def data_other_shape(a):
        a.data = torch.zeros(4, 5)

    return [resize_same_ndim, resize_to_fewer_elements, unsqueeze, transpose_square, set_other_strides,
            requires_grad_on, data_other_dtype, data_other_shape]


@pytest.mark.parametrize("mutate", _in_place_mutations(), ids=lambda f: f.__name__)
def test_tensor_mutated_in_place_fails_the_packed_compare(mutate):
    fd, tc = CountingBackend(), CountingBackend()
    opt = ferrodyn.compile(_three, backend=fd, dynamic=False)
    ref = torch.compile(_three, backend=tc, dynamic=False)
    args = [torch.randn(4, 4), torch.randn(3), torch.randn(2, 2, 2)]
    for _ in range(3):  # compile, fill the replay's memory, replay
        torch.testing.assert_close(opt(*args), _three(*args))
        torch.testing.assert_close(ref(*args), _three(*args))
    (entry,) = _C.cache_entries(_three.__code__)
    tree = entry.guards
    assert tree._plan_stats()[2] == 3  # the three tensor leaves are packed
    assert tree._replay(tuple(args)) is True  # argument slots only: every minor replays
    with torch.no_grad():
        mutate(args[0])  # the same object, changed in place
    _agrees(tree, tuple(args), want=False)
    for _ in range(2):
        torch.testing.assert_close(opt(*args), _three(*args))
        torch.testing.assert_close(ref(*args), _three(*args))
    assert fd.count == tc.count == 2


def test_requires_grad_flipped_off_on_a_parameter():
    lin = torch.nn.Linear(4, 4)
    b = _C.GuardBuilder()
    b.tensor_match(b.local(0, "w"), lin.weight)
    tree = b.build()
    assert tree._plan_stats()[2] == 1
    assert _agrees(tree, (lin.weight,), want=True)
    lin.weight.requires_grad_(False)
    _agrees(tree, (lin.weight,), want=False)
    lin.weight.requires_grad_(True)
    _agrees(tree, (lin.weight,), want=True)
    _agrees(tree, (lin.weight * 1,), want=False)  # a plain tensor with a grad_fn: another type


def test_device_and_dtype_changes_fail():
    t = torch.zeros(3, 4)
    b = _C.GuardBuilder()
    b.tensor_match(b.local(0, "t"), t)
    tree = b.build()
    assert _agrees(tree, (t,), want=True)
    _agrees(tree, (torch.zeros(3, 4, device="meta"),), want=False)
    _agrees(tree, (torch.zeros(3, 4, dtype=torch.float16),), want=False)
    _agrees(tree, (torch.zeros(3, 4, dtype=torch.int32),), want=False)
    _agrees(tree, (torch.zeros(3, 4)[:, :4],), want=True)  # a view with the same metadata
    _agrees(tree, (torch.zeros(12)[:12].view(3, 4),), want=True)


def _matches(example, t, dynamic):
    """tensor_match's meaning, through the Python API."""
    if (type(t), t.dtype, t.device, t.requires_grad, t.dim()) != \
            (type(example), example.dtype, example.device, example.requires_grad, example.dim()):
        return False
    return all(d in dynamic or (t.size(d), t.stride(d)) == (example.size(d), example.stride(d))
               for d in range(t.dim()))


@pytest.mark.parametrize("ndim", [0, 1, 2, 3, 5, 6])
def test_dims_past_the_first_two_and_dynamic_dims(ndim):
    shape = tuple(range(2, 2 + ndim))
    t = torch.zeros(shape)
    dynamic = [0] if ndim else []
    b = _C.GuardBuilder()
    b.tensor_match(b.local(0, "t"), t, dynamic_dims=dynamic)
    tree = b.build()
    assert tree._plan_stats()[2] == (1 if ndim <= 5 else 0)  # 5 dims inline at most
    others = [torch.zeros(shape), torch.zeros(shape + (1,)), torch.zeros(shape[:-1]), torch.zeros(1)]
    for d in range(ndim):
        grown = list(shape)
        grown[d] += 1
        others.append(torch.zeros(grown))  # only dim 0 (dynamic) may change
        wide = list(shape)
        wide[d] *= 2
        # the same sizes with the strides of a wider tensor: only a change at dims past d
        others.append(torch.zeros(wide)[tuple(slice(0, n) for n in shape)])
    if ndim >= 2:
        others.append(torch.zeros(shape[::-1]).transpose(0, ndim - 1).contiguous().transpose(0, ndim - 1))
    verdicts = set()
    for other in others:
        want = _matches(t, other, dynamic)
        _agrees(tree, (other,), want=want)
        verdicts.add(want)
    assert verdicts == {True, False}


def test_a_locals_dict_is_reread_once_it_changes():
    t, other = torch.zeros(2, 3), torch.zeros(3, 3)
    b = _C.GuardBuilder()
    b.tensor_match(b.local(0, "x"), t)
    tree = b.build()
    d = {"x": t}
    assert tree.check(d) and tree._full_check(d)
    assert tree._replay(d) in (None, True)
    d["x"] = other  # the same dict, a new value under the remembered key
    assert tree._replay(d) in (None, False) and not tree._full_check(d)
    d["x"] = t
    assert tree._replay(d) in (None, True) and tree._full_check(d)
    assert tree.check({"x": other}) is False  # another dict: its own lookup
    del d["x"]
    assert tree._replay(d) in (None, False) and not tree._full_check(d)


def test_identity_leaf_fails_for_a_new_object_at_a_dead_ones_address():
    class Obj:  # an uncommon size class: few other allocations compete for the freed block
        __slots__ = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "__weakref__")

    obj = Obj()
    b = _C.GuardBuilder()
    b.is_(b.local(0, "o"), obj)
    tree = b.build()
    _agrees(tree, (obj,), want=True)
    addr, alive = id(obj), weakref.ref(obj)
    del obj
    gc.collect()
    assert alive() is None
    fresh = [Obj() for _ in range(2000)]
    reused = [o for o in fresh if id(o) == addr]
    assert reused  # pymalloc hands the freed block back to the same size class
    _agrees(tree, (reused[0],), want=False)
    _agrees(tree, (fresh[0] if fresh[0] is not reused[0] else fresh[1],), want=False)
    _agrees(tree, (reused,), want=False)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


class OtherLayer(Layer):
    def forward(self, x):
        return self.lin(x) - 1


class Stack(torch.nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class StackHarness:
    def __init__(self):
        torch.manual_seed(0)
        self.mod = Stack()
        self.fd, self.tc = CountingBackend(), CountingBackend()
        self.opt = ferrodyn.compile(self.mod, backend=self.fd)
        self.ref = torch.compile(self.mod, backend=self.tc)
        self.x = torch.randn(2, 4)
        self.torch_reference = True
        for _ in range(3):
            self.step()
        tree = self.tree()
        nodes, leaves, packed = tree._plan_stats()
        # type(layers[i]).forward and its globals are read through twins, their identity
        # leaves skipped, every parameter packed.
        assert nodes > 0 and leaves > 0 and packed == 1 + 2 * 4
        with torch.no_grad():
            assert tree._replay((self.mod, self.x), Stack.forward.__globals__) is REPLAYED

    @staticmethod
    def tree():
        entries = _C.cache_entries(Stack.forward.__code__)
        return entries[0].guards

    def differential(self):
        tree = self.tree()
        args = (self.mod, self.x)
        with torch.no_grad():
            replayed = tree._replay(args, Stack.forward.__globals__)
            full = tree._full_check(args, Stack.forward.__globals__)
        assert replayed in (None, full), (replayed, full)
        return full

    def step(self):
        with torch.no_grad():
            expected = self.mod(self.x)
            torch.testing.assert_close(self.opt(self.x), expected)
            if self.torch_reference:
                torch.testing.assert_close(self.ref(self.x), expected)


def _stack_mutations():
    def one_layer_changes_class(h):  # type(layers[2]) is no longer the twins' type
        h.mod.layers[2].__class__ = OtherLayer

    def one_layer_gets_a_forward_hook(h):  # one hooks dict of four changes length
        h.torch_reference = False  # torch.compile skips submodule hook guards by default
        h.mod.layers[3].register_forward_hook(lambda m, i, o: o + 100)

    def layers_reordered(h):  # the same keys in another order: the keys leaf must fail
        mods = h.mod.layers._modules
        mods["1"] = mods.pop("1")

    def layer_replaced(h):
        h.mod.layers[0] = Layer()

    def parameter_reassigned(h):
        h.mod.layers[3].lin.weight = torch.nn.Parameter(torch.randn(4, 4))

    def parameter_resized_in_place(h):
        with torch.no_grad():
            h.mod.layers[1].lin.bias.set_(torch.zeros(4).untyped_storage(), 0, (4,), (1,))
            h.mod.layers[1].lin.weight.t_()

    def module_attribute_added(h):
        h.mod.layers[2].extra = 5

    def layer_dict_replaced(h):
        layer = h.mod.layers[1]
        layer.__dict__ = dict(layer.__dict__)

    return [one_layer_changes_class, one_layer_gets_a_forward_hook, 
            layers_reordered, layer_replaced, parameter_reassigned, parameter_resized_in_place,
            module_attribute_added, layer_dict_replaced]


@pytest.mark.parametrize("mutate", _stack_mutations(), ids=lambda f: f.__name__)
def test_module_mutation_through_twins_and_skipped_leaves(mutate):
    h = StackHarness()
    mutate(h)
    h.differential()
    h.step()
    h.step()
    if h.torch_reference:
        assert h.fd.count == h.tc.count
    h.differential()


def test_class_forward_replaced_is_seen_by_every_twin():
    h = StackHarness()
    saved = Layer.forward
    try:
        Layer.forward = lambda self, x: self.lin(x) * 3
        h.torch_reference = False  # torch keeps its graph (no guard on an inlined class method)
        assert h.differential() is False
        h.step()
        h.step()
    finally:
        Layer.forward = saved


class _A:
    f = object()


class _B:
    f = object()


class _C2(_A):
    pass


def test_twin_accessors_read_each_parent():
    # type(p).f and type(q).f are twins, and so are d0['k'] and d1['k']: one read serves both
    # only when both parents are the same object.
    b = _C.GuardBuilder()
    for i, name in enumerate(("p", "q")):
        b.is_(b.attr(b.type_of(b.local(i, name)), "f"), _A.f)
    d0, d1 = b.item(b.local(2, "d0"), "k"), b.item(b.local(3, "d1"), "k")
    b.equals(d0, 1)
    b.equals(d1, 1)
    tree = b.build()
    nodes, leaves, _ = tree._plan_stats()
    assert nodes >= 3 and leaves >= 2
    ok = (_A(), _A(), {"k": 1}, {"k": 1})
    for _ in range(2):  # the second check replays
        assert _agrees(tree, ok, want=True)
    _agrees(tree, (_A(), _C2(), {"k": 1}, {"k": 1}), want=True)  # another type, the same f
    _agrees(tree, (_A(), _B(), {"k": 1}, {"k": 1}), want=False)
    _agrees(tree, (_B(), _A(), {"k": 1}, {"k": 1}), want=False)
    _agrees(tree, (_A(), _A(), {"k": 1}, {"k": 2}), want=False)
    shared = {"k": 1}
    _agrees(tree, (_A(), _A(), shared, shared), want=True)
    shared["k"] = 3
    _agrees(tree, (_A(), _A(), shared, shared), want=False)
    _C2.f = _B.f  # the subclass's own attribute now differs
    try:
        _agrees(tree, (_A(), _C2(), {"k": 1}, {"k": 1}), want=False)
    finally:
        del _C2.f


def test_weakref_referent_read_directly_where_verified():
    import sys
    assert _C._weakref_direct() is (sys.version_info < (3, 14))  # the header layout of 3.11-3.13

"""Stores of class attributes from traced code (`Cls.counter += 1`, `type(self).cache = ...`,
`setattr(Cls, name, v)`): recorded in the SideEffects table, replayed after the graph in program
order (flushed before an eager region at a graph break), seen by later reads in the same trace
(through the class, a subclass, an instance, `super()`); reads of class attributes are guarded,
so a class attribute changed outside recompiles. Stores on classes whose metaclass overrides
`__setattr__`, on builtin/extension types, of special names or of descriptor values are
refused (the frame, or the code after a break, runs eagerly), never guessed. Compiled == eager
(results and class state), graph counts against torch.compile's."""

import pytest
import torch
import torch._dynamo

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _classes():
    class Base:
        count = 0
        scale = 2.0
        tag = "base"

        def bump(self, x):
            type(self).count += 1
            Base.scale = Base.scale * 2
            return x * self.scale + type(self).count

    class Child(Base):
        def via_super(self):
            return super().tag

    return Base, Child


def _state(classes):
    return [{k: v for k, v in vars(c).items() if k in ("count", "scale", "tag", "extra")}
            for c in classes]


def _run_all(fn, calls=3):
    """fn(x, Base, Child) eagerly, with ferrodyn and with torch.compile, each on its own fresh
    classes, `calls` times: ferrodyn's results and class state must be eager's. Returns
    (ferrodyn graphs, torch.compile graphs)."""
    ours, theirs = CountingBackend(), CountingBackend()
    torch._dynamo.reset()
    results = {}
    for name, f in (("eager", fn), ("ferrodyn", ferrodyn.compile(fn, backend=ours)),
                    ("torch", torch.compile(fn, backend=theirs))):
        base, child = _classes()
        x = torch.arange(3.0)
        outs = [f(x, base, child) for _ in range(calls)]
        results[name] = (outs, _state((base, child)))
    torch._dynamo.reset()
    # torch.compile's values are not compared: the pinned version returns stale class
    # attributes in some of these cases (counter_through_instance, setattr_..._super)
    outs, state = results["ferrodyn"]
    for got, want in zip(outs, results["eager"][0]):
        torch.testing.assert_close(got, want)
    assert state == results["eager"][1]
    return ours.count, theirs.count


def counter_through_instance(x, base, child):
    c = child()
    y = c.bump(x)             # stores on Child (type(self)) and on Base
    return y + c.count + base.count + c.scale  # later reads see the pending values


def test_counter_bumped_through_type_self_and_class():
    ours, theirs = _run_all(counter_through_instance)
    # the class attributes read are guarded: each call, which changes them, recompiles
    # (torch.compile recompiles less here, and returns stale values)
    assert ours == 3 and theirs <= ours


def setattr_builtin_and_super(x, base, child):
    setattr(base, "tag", "changed")
    c = child()
    c.tag = "instance"        # an instance attribute shadows the class's
    return x * len(c.via_super()) + len(child.tag) + len(c.tag)


def test_setattr_seen_through_subclass_super_and_instance():
    ours, theirs = _run_all(setattr_builtin_and_super, calls=2)
    assert ours <= theirs


def store_then_break(x, base, child):
    base.extra = 5.0
    seen = _read_outside(base)  # runs eagerly at a graph break: the store is flushed first
    base.extra = seen + 1.0
    return x * base.extra


@ferrodyn.disable
def _read_outside(cls):
    return cls.extra


def test_store_flushed_before_a_graph_break():
    _run_all(store_then_break, calls=2)


class Scaled:
    factor = 2.0


def read_class_attr(x):
    return x * Scaled.factor


def test_changed_class_attribute_recompiles():
    cnt = CountingBackend()
    f = ferrodyn.compile(read_class_attr, backend=cnt)
    x = torch.arange(3.0)
    torch.testing.assert_close(f(x), x * 2.0)
    Scaled.factor = 5.0
    try:
        torch.testing.assert_close(f(x), x * 5.0)
    finally:
        Scaled.factor = 2.0
    assert cnt.count == 2


class Recording(type):
    log = []

    def __setattr__(cls, name, value):
        Recording.log.append(name)
        super().__setattr__(name, value)


class WithMeta(metaclass=Recording):
    n = 1


def store_on_metaclass_class(x):
    WithMeta.n = WithMeta.n + 1
    return x + WithMeta.n


def test_metaclass_setattr_is_not_bypassed():
    Recording.log.clear()
    WithMeta.n = 1
    f = ferrodyn.compile(store_on_metaclass_class, backend=CountingBackend())
    x = torch.arange(3.0)
    torch.testing.assert_close(f(x), x + 2)
    assert WithMeta.n == 2 and Recording.log == ["n", "n"]  # the test's reset, then the store


def store_on_builtin(x):
    setattr(int, "extra", 1)
    return x + 1


def test_store_on_builtin_type_raises_as_eager():
    with pytest.raises(TypeError):
        store_on_builtin(torch.ones(1))
    with pytest.raises(TypeError):
        ferrodyn.compile(store_on_builtin, backend=CountingBackend())(torch.ones(1))


def store_function_on_class(x, base, child):
    base.helper = lambda self: 3.0  # a function on a class binds: refused, runs eagerly
    return x * child().helper()


def test_function_stored_on_class_runs_eagerly():
    _run_all(store_function_on_class, calls=1)

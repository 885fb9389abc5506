"""Mutations of state that outlives the frame (side_effects.py): lists, dicts, sets, object and
module attributes, globals, closure cells, escaping new objects; replayed after the graph in
program order. Each case: ferrodyn vs eager (results and mutated state after every call) and
graph counts vs torch.compile."""

import pytest
import torch

from side_effects_harness import differential

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

T = lambda g: torch.ones(2)  # noqa: E731


class Obj:
    def __init__(self):
        self.n = 0
        self.items = []


CASES = {
    # name: (source, make_args)
    "list_append": ("""
        def f(xs, x):
            xs.append(len(xs))
            return x + len(xs)
    """, lambda g: ([1], torch.ones(2))),
    "list_ops": ("""
        def f(xs, x):
            xs.insert(0, 7); xs.extend([1, 2]); xs.remove(1); xs[1] = 5; del xs[-1]
            xs.reverse(); xs.sort()
            return x * len(xs), xs.pop()
    """, lambda g: ([3, 4], torch.ones(2))),
    "list_slice_assign": ("""
        def f(xs, x):
            xs[:] = [len(xs) > 0, len(xs)]
            return x + 1
    """, lambda g: ([3, 4, 5], torch.ones(2))),
    "dict_ops": ("""
        def f(d, x):
            d[len(d)] = 1
            d.pop(0, None)
            d.setdefault("s", 3)
            d.update({"u": 4})
            return x * len(d)
    """, lambda g: ({0: 1, "k": 2}, torch.ones(2))),
    "dict_clear": ("""
        def f(d, x):
            d.clear()
            d["a"] = len(d)
            return x + 1
    """, lambda g: ({"z": 1, "y": 2}, torch.ones(2))),
    "dict_tensor_value": ("""
        def f(d, x):
            d["out"] = x * 2
            return x + 1
    """, lambda g: ({"in": 1}, torch.ones(2))),
    "object_attrs": ("""
        def f(o, x):
            o.n += 1
            o.items.append(o.n)
            o.new = [o.n]
            return x + o.n
    """, lambda g: (g["Obj"](), torch.ones(2))),
    "object_swap": ("""
        def f(o, x):
            o.items, o.n = o.n, o.items
            return x + 1
    """, lambda g: (g["Obj"](), torch.ones(2))),
    "object_delattr": ("""
        def f(o, x):
            del o.n
            return x + hasattr(o, "n")
    """, lambda g: (g["Obj"](), torch.ones(2))),
    "escaping_new_object_shared": ("""
        def f(o, x):
            r = []
            o.a = r
            o.b = r
            r.append(len(o.items))
            return x + 1, r
    """, lambda g: (g["Obj"](), torch.ones(2))),
    "new_object_escapes": ("""
        def f(o, x):
            p = Obj()
            p.n = 5
            o.child = p
            return x + 1
    """, lambda g: (g["Obj"](), torch.ones(2))),
    "global_store": ("""
        G = 0
        def f(x):
            global G
            G += 1
            return x + G
    """, lambda g: (torch.ones(2),)),
    "global_store_tensor_and_read_back": ("""
        H = None
        def g2():
            return H
        def f(x):
            global H
            H = x * 3
            return g2() + 1
    """, lambda g: (torch.ones(2),)),
    "global_delete": ("""
        G = 1
        def f(x):
            global G
            del G
            return x + 1
    """, lambda g: (torch.ones(2),)),
    "nonlocal_counter": ("""
        def make():
            c = 0
            def inc(x):
                nonlocal c
                c += 1
                return x + c
            return inc
        f = make()
    """, lambda g: (torch.ones(2),)),
    "nonlocal_inlined": ("""
        def make():
            c = [0]
            n = 0
            def bump():
                nonlocal n
                n += 1
                return n
            return bump
        bump = make()
        def f(x):
            return x + bump() + bump()
    """, lambda g: (torch.ones(2),)),
    "mutation_order": ("""
        def f(a, b, x):
            a.append(1)
            b.append(len(a))
            a.append(len(b))
            a.append(len(b))
            return x + 1
    """, lambda g: ([], [], torch.ones(2))),
    "read_after_write_through_alias": ("""
        def f(o, x):
            alias = o.items
            alias.append(x.shape[0])
            return x + len(o.items)
    """, lambda g: (g["Obj"](), torch.ones(2))),
}

# torch.compile breaks the graph on these (DELETE_GLOBAL) and captures nothing; ferrodyn
# captures the frame and replays the deletion.
TORCH_BREAKS = {"global_delete"}

STATE = {
    "global_store": lambda g: g["G"],
    "global_store_tensor_and_read_back": lambda g: g["H"],
    "global_delete": lambda g: "G" in g,
    "nonlocal_counter": lambda g: g["f"].__closure__[0].cell_contents,
    "nonlocal_inlined": lambda g: g["bump"].__closure__[0].cell_contents,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_side_effect_replayed(name):
    src, make_args = CASES[name]
    src = "class Obj:\n    def __init__(self):\n        self.n = 0\n        self.items = []\n" + \
        __import__("textwrap").dedent(src)
    calls = 1 if name == "global_delete" else 3
    out = differential(src, "f", make_args, calls=calls, state=STATE.get(name, lambda g: None),
                       compare_torch_count=name not in TORCH_BREAKS)
    assert out["ferrodyn"][1] == 1  # captured, not run eagerly
    if name in TORCH_BREAKS:
        assert out["torch"][1] == 0


def test_module_counter_and_buffer():
    """nn.Module non-parameter attributes (a counter) and an in-place buffer update."""
    src = """
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.lin = torch.nn.Linear(2, 2)
                self.count = 0
                self.register_buffer("buf", torch.zeros(2))
            def forward(self, x):
                self.count += 1
                self.buf.add_(1)
                return self.lin(x) + self.count + self.buf
        m = M()
        def f(x):
            return m(x)
    """
    out = differential(src, "f", lambda g: (torch.ones(2),), state=lambda g: g["m"])
    assert out["ferrodyn"][1] == 1


def test_inplace_on_global_and_default_tensors_reaches_them():
    src = """
        GT = torch.zeros(3)
        def f(x, d=torch.ones(3)):
            GT.mul_(2).add_(1)
            d.add_(1)
            return x + GT + d
    """
    differential(src, "f", lambda g: (torch.ones(3),),
                 state=lambda g: (g["GT"], g["f"].__defaults__))


def test_inplace_only_graph_still_runs():
    """A graph whose only effect is an in-place op on an input is called although the return
    value does not use it."""
    src = """
        def f(x):
            x.add_(1)
    """
    differential(src, "f", lambda g: (torch.ones(3),))


def test_custom_setattr_is_refused_not_bypassed():
    """A class with a custom __setattr__ must run it: not modelled, so the frame runs eagerly
    (the value is still right)."""
    src = """
        class Logged:
            def __init__(self):
                object.__setattr__(self, "log", [])
            def __setattr__(self, k, v):
                self.log.append(k)
                object.__setattr__(self, k, v)
        def f(o, x):
            o.y = 1
            return x
    """
    out = differential(src, "f", lambda g: (g["Logged"](), torch.ones(2)),
                       compare_torch_count=False)
    assert out["ferrodyn"][1] == 0


@pytest.mark.parametrize("same", [True, False])
def test_aliasing_between_arguments_and_attributes_same_tracker(same):
    """One list reached as an argument and as an attribute: one state (mutations through one
    name are seen through the other)."""
    src = """
        class Box:
            pass
        def f(xs, box, x):
            xs.append(1)
            return x + len(box.items)
        def make(g, same):
            b = g["Box"]()
            b.items = []
            return (b.items if same else [], b, torch.ones(2))
    """
    differential(src, "f", lambda g: g["make"](g, same))


def test_aliasing_guard_recompiles_when_aliasing_changes():
    """Compiled with distinct lists, then called with one list twice (and back): the aliasing
    guard fails and the result follows eager every time."""
    import ferrodyn
    from counting_backend import CountingBackend

    def f(a, b, x):
        a.append(1)
        return x + len(b)
    cb = CountingBackend()
    c = ferrodyn.compile(f, backend=cb)
    for same in (False, True, False, True):
        a_e = []
        b_e = a_e if same else []
        a_c = []
        b_c = a_c if same else []
        assert torch.equal(c(a_c, b_c, torch.ones(2)), f(a_e, b_e, torch.ones(2)))
        assert (a_c, b_c) == (a_e, b_e)
    assert cb.count == 2


IDENTITY_CASES = {
    # fresh containers and objects are distinct objects (`is`) even when equal
    "fresh_containers_are_distinct": """
        def f(x):
            a, b = [], []
            c, d = {}, {}
            e, g = Obj(), Obj()
            return x + 1, (a is b, c is d, e is g, a == b, c == d)
    """,
    "new_list_returned_twice_is_one_object": """
        def f(x):
            xs = [x + 1]
            return xs, xs, {"k": xs}
    """,
    "new_object_returned_and_stored_is_one_object": """
        def f(o, x):
            p = Obj()
            p.n = 3
            o.child = p
            return x + 1, p
    """,
}


@pytest.mark.parametrize("name", sorted(IDENTITY_CASES))
def test_identity_of_new_objects(name):
    """The aliasing structure of what the entry returns and stores is that of eager (the
    snapshot records which parts are the same object)."""
    src = "class Obj:\n    def __init__(self):\n        self.n = 0\n        self.items = []\n" + \
        __import__("textwrap").dedent(IDENTITY_CASES[name])
    make = (lambda g: (g["Obj"](), torch.ones(2))) if "def f(o," in src else \
        (lambda g: (torch.ones(2),))
    out = differential(src, "f", make)
    assert out["ferrodyn"][1] == 1


def test_inplace_on_closure_tensor_reaches_it():
    src = """
        def make():
            t = torch.zeros(2)
            def f(x):
                t.add_(x)
                return t * 1
            return f
        f = make()
    """
    differential(src, "f", lambda g: (torch.ones(2),),
                 state=lambda g: g["f"].__closure__[0].cell_contents)


DICT_VIEW_OF_OBJECT_CASES = {
    "write_dict_read_attr": """
        def f(o, x):
            d = o.__dict__
            d["n"] = 7
            return x + o.n
    """,
    "write_attr_read_dict": """
        def f(o, x):
            o.n = 1
            return x + o.__dict__["n"]
    """,
    "read_dict_then_write_attr": """
        def f(o, x):
            d = o.__dict__
            o.n = 5
            return x + d["n"]
    """,
}


@pytest.mark.parametrize("name", sorted(DICT_VIEW_OF_OBJECT_CASES))
def test_object_attributes_and_its_dict_agree(name):
    """An object's attributes and its `__dict__` used as a dict are one state: a write through
    one is seen through the other, or the frame is refused — never a stale read."""
    src = "class Obj:\n    def __init__(self):\n        self.n = 0\n        self.items = []\n" + \
        __import__("textwrap").dedent(DICT_VIEW_OF_OBJECT_CASES[name])
    differential(src, "f", lambda g: (g["Obj"](), torch.ones(2)), compare_torch_count=False)


def test_module_internal_dicts_are_not_mutated_behind_lookups():
    """A write into `_buffers` through its dict tracker is seen by module attribute lookup
    (nn_module_state.py: the mutated dict's tracker is the truth) and replayed; a write into a
    hook dict would not be seen by module calls (they read those dicts directly): refused,
    values stay right."""
    src = """
        m = torch.nn.Linear(2, 2)
        def f(x):
            m._buffers["extra"] = x * 2
            return x + m.extra
        def g(x):
            m._forward_hooks[0] = lambda mod, inp, out: out * 0
            return m(x)
    """
    import ferrodyn
    state = lambda g: sorted(g["m"]._buffers)  # noqa: E731
    differential(src, "f", lambda g: (torch.ones(2),), calls=2, state=state)
    differential(src, "g", lambda g: (torch.ones(2),), calls=1, compare_torch_count=False)
    ns = {"torch": torch}
    exec(__import__("textwrap").dedent(src), ns)
    report = ferrodyn.explain(ns["g"])(torch.ones(2))
    assert any("internal dict" in str(r) for r in report.break_reasons)

"""Differential state machine over sets (variables/sets.py, side_effects.py): a set held in two
names (one object, or two objects that start equal), mutated through one name and read through
the other (`in`, `len`, `sorted` iteration of ints, iteration of a set of objects), sets of
objects and tensors by identity, a graph break between two mutations. Every call runs the same
operation eagerly and through `ferrodyn.compile` on two parallel environments; results and the
whole state (contents, iteration order of int sets, aliasing) are compared after every call.
The compiled functions live for the whole run, so cache hits, guard failures and recompiles
are exercised as the sets change."""

from __future__ import annotations

import textwrap

import torch
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import ferrodyn
from counting_backend import CountingBackend

INT_OPS = [
    "a.add(v)",
    "a.discard(v)",
    "a.update([v, v + 1])",
    "if v in a:\n    a.remove(v)",
    "a |= {v, 2 * v}",
    "a -= {v}",
    "a.difference_update([v, 1])",
    "a.intersection_update(range(v + 3))",
    "if len(a) > 6:\n    a.clear()",
    "if len(a) == 1:\n    a.pop()",
    "a.add(v)\ntorch._dynamo.graph_break()\na.add(v + 9)",
]

OBJ_OPS = [
    "p.add(o)",
    "p.discard(o)",
    "p.add(t)",
    "p.discard(t)",
    "p.update([o, t])",
    "if o in p:\n    p.remove(o)",
    "p -= {t}",
]

INT_READ = "return x + len(b), v in b, sorted(b), len(a), a is b, {v, 1} <= b"
OBJ_READ = "return x * len(q), o in q, t in q, q.isdisjoint({o}), p == q"
# iteration of a set of objects from outside the frame, not mutated by the frame: positional
ITER_READ = ("n = 0\nfor e in q:\n    n += e in p\nfor e in p:\n    if isinstance(e, torch.Tensor):\n        x = x + e\n"
             "return x * len(q), n")


def _fn(name: str, params: str, body: str, read: str):
    src = f"def {name}({params}):\n" + textwrap.indent(body + "\n" + read, "    ")
    g = {"torch": torch}
    exec(compile(src, f"<sets {name}>", "exec"), g)
    return g[name]


class Obj:
    pass


class Env:
    """The state one side mutates: two int-set names, two object-set names, a pool of objects
    and tensors (members are compared by their position in the pool)."""

    def __init__(self, alias_ints: bool, alias_objs: bool):
        self.a = {1, 2}
        self.b = self.a if alias_ints else {1, 2}
        self.pool = [Obj(), Obj(), Obj(), torch.ones(2), torch.full((2,), 2.0)]
        self.p = {self.pool[0]}
        self.q = self.p if alias_objs else {self.pool[0]}

    def index(self, x):
        return next(i for i, y in enumerate(self.pool) if y is x)

    def snap(self):
        members = lambda s: sorted(self.index(x) for x in s)  # noqa: E731
        return (list(self.a), list(self.b), self.a is self.b, members(self.p), members(self.q),
                self.p is self.q)


def _same(x, y):
    if isinstance(x, torch.Tensor):
        torch.testing.assert_close(x, y)
    elif isinstance(x, (tuple, list)):
        assert type(x) is type(y) and len(x) == len(y), (x, y)
        for i, j in zip(x, y):
            _same(i, j)
    else:
        assert x == y, (x, y)


class SetMachine(RuleBasedStateMachine):
    @initialize(alias_ints=st.booleans(), alias_objs=st.booleans())
    def setup(self, alias_ints, alias_objs):
        ferrodyn.reset()
        self.eager, self.comp = Env(alias_ints, alias_objs), Env(alias_ints, alias_objs)
        self.backend = CountingBackend()
        self.int_fns = [_fn("f", "a, b, v, x", op, INT_READ) for op in INT_OPS]
        self.obj_fns = [_fn("g", "p, q, o, t, x", op, OBJ_READ) for op in OBJ_OPS]
        self.iter_fn = _fn("h", "p, q, o, t, x", "", ITER_READ)
        self.compiled = {}

    def _compiled(self, fn):
        if fn not in self.compiled:
            self.compiled[fn] = ferrodyn.compile(fn, backend=self.backend)
        return self.compiled[fn]

    def _both(self, fn, args_of):
        results = []
        for env, f in ((self.eager, fn), (self.comp, self._compiled(fn))):
            try:
                results.append(("ok", f(*args_of(env))))
            except Exception as e:  # eager raising must be reproduced
                results.append(("raised", type(e).__name__))
        assert results[0][0] == results[1][0], results
        _same(results[0], results[1])

    @rule(op=st.integers(0, len(INT_OPS) - 1), v=st.integers(0, 9), through_b=st.booleans())
    def int_op(self, op, v, through_b):
        def args(env):
            a, b = (env.b, env.a) if through_b else (env.a, env.b)
            return a, b, v, torch.ones(2)
        self._both(self.int_fns[op], args)

    @rule(op=st.integers(0, len(OBJ_OPS) - 1), o=st.integers(0, 2), t=st.integers(3, 4))
    def obj_op(self, op, o, t):
        self._both(self.obj_fns[op],
                   lambda env: (env.p, env.q, env.pool[o], env.pool[t], torch.ones(2)))

    @rule(t=st.integers(3, 4))
    def obj_iterate(self, t):
        self._both(self.iter_fn, lambda env: (env.p, env.q, None, env.pool[t], torch.ones(2)))

    @invariant()
    def same_state(self):
        if hasattr(self, "eager"):
            assert self.eager.snap() == self.comp.snap()

    def teardown(self):
        ferrodyn.reset()


SetMachine.TestCase.settings = settings(max_examples=12, stateful_step_count=12, deadline=None,
                                        suppress_health_check=list(HealthCheck))
test_set_state_machine = SetMachine.TestCase


def test_machine_compiles_something():
    """The machine is not vacuous: its operations are captured (not all run eagerly)."""
    env = Env(True, False)
    cb = CountingBackend()
    ferrodyn.reset()
    try:
        f = ferrodyn.compile(_fn("f", "a, b, v, x", INT_OPS[0], INT_READ), backend=cb)
        g = ferrodyn.compile(_fn("g", "p, q, o, t, x", OBJ_OPS[2], OBJ_READ), backend=cb)
        f(env.a, env.b, 3, torch.ones(2))
        g(env.p, env.q, env.pool[1], env.pool[3], torch.ones(2))
        assert cb.count == 2
    finally:
        ferrodyn.reset()

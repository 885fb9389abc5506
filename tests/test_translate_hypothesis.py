"""Differential test: random programs built from the supported constructs are captured whole
(one graph, no Unsupported) and the graph's result equals eager."""

import textwrap

import torch
from hypothesis import given, settings, strategies as st, HealthCheck

from translate_harness import check

UNARY = ["torch.sin", "torch.tanh", "torch.relu", "torch.sigmoid", "torch.abs"]
METHODS = ["exp", "neg", "sin", "cos", "square"]
BINOPS = ["+", "-", "*"]


def _stmt(draw, depth):
    kind = draw(st.sampled_from(
        ["bin", "unary", "method", "if", "for", "comp", "helper", "tuple", "dict", "index",
         "int", "nograd", "while", "inplace", "fstring", "closure", "set", "obj", "module",
         "walrus"] if depth < 2 else
        ["bin", "unary", "method", "int", "index", "tuple"]))
    k = draw(st.integers(0, 3))
    if kind == "bin":
        return [f"x = x {draw(st.sampled_from(BINOPS))} y"]
    if kind == "unary":
        return [f"x = {draw(st.sampled_from(UNARY))}(x)"]
    if kind == "method":
        return [f"x = x.{draw(st.sampled_from(METHODS))}().clamp(-3, 3)"]
    if kind == "if":
        body = _stmt(draw, depth + 1)
        other = _stmt(draw, depth + 1)
        return [f"if n > {k}:"] + ["    " + s for s in body] + ["else:"] + \
            ["    " + s for s in other]
    if kind == "for":
        body = _stmt(draw, depth + 1)
        return [f"for i in range({k}):"] + ["    " + s for s in body] + ["    n = n + i"]
    if kind == "while":
        return ["j = 0", f"while j < {k}:", "    x = x * 0.5 + j", "    j += 1"]
    if kind == "comp":
        return [f"acc = [x * (j + 1) for j in range({k + 1}) if j != n]",
                "x = (sum(acc) + x) / (len(acc) + 1)"]
    if kind == "helper":
        return [f"x = helper(x, k={k})"]
    if kind == "tuple":
        return ["t = (x, y)", "a, b = t", "x = a * 0.5 + b"]
    if kind == "dict":
        return ["d = {'a': x, 'b': n}", "d['c'] = y", "x = d['a'] + d['c'] * d['b']"]
    if kind == "index":
        return ["x = x + xs[n % len(xs)]"]
    if kind == "int":
        return [f"n = n * {k} + {k + 1}"]
    if kind == "nograd":
        return ["with torch.no_grad():", "    y = y * 0.9"]
    if kind == "inplace":
        return ["x = x.clone()", f"x.add_({k})", "x *= 0.5"]
    if kind == "fstring":
        return [f"tag = f'n={{n}}-{k}'", "x = x + len(tag)"]
    if kind == "closure":
        return ["scale = n + 1", "def mul(v):", "    return v * scale", "x = mul(x) * 0.1"]
    if kind == "set":
        return ["s = {n, n + 1, 2}", "s.add(7)", "x = x + len(s) + (1 if 2 in s else 0)"]
    if kind == "obj":
        return ["o = Acc(x)", "o.add(y)", f"o.add({k})", "x = o.total * 0.5"]
    if kind == "module":
        return ["x = LIN(x).tanh()"]
    if kind == "walrus":
        return ["if (m := n + 1) > 2:", "    x = x * m"]
    raise AssertionError(kind)


@st.composite
def programs(draw):
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        lines += _stmt(draw, 0)
    ret = draw(st.sampled_from(["x, n", "[x, y]", "{'x': x, 'n': n}", "(x, (y, n))"]))
    body = "\n".join("    " + s for s in lines)
    return f"def f(x, y, n, xs):\n{body}\n    return {ret}\n"


def helper(v, k=1):
    return v * k - v.mean()


class Acc:
    def __init__(self, start):
        self.total = start

    def add(self, v):
        self.total = self.total + v


LIN = torch.nn.Linear(3, 3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=programs(), n=st.integers(0, 4))
def test_random_programs_match_eager(src, n):
    ns = {"torch": torch, "helper": helper, "Acc": Acc, "LIN": LIN}
    exec(compile(textwrap.dedent(src), "<generated>", "exec"), ns)
    fn = ns["f"]
    args = (torch.randn(3), torch.randn(3), n, [torch.randn(3), torch.randn(3)])
    result = check(fn, *args)  # raises Unsupported if the frame could not be captured whole
    assert result.graph is not None


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=programs(), n=st.integers(0, 4))
def test_random_programs_through_compile_one_graph(src, n):
    import ferrodyn
    from translate_harness import assert_same

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ns = {"torch": torch, "helper": helper, "Acc": Acc, "LIN": LIN}
    exec(compile(textwrap.dedent(src), "<generated>", "exec"), ns)
    fn = ns["f"]
    args = (torch.randn(3), torch.randn(3), n, [torch.randn(3), torch.randn(3)])
    ferrodyn.reset()
    try:
        compiled = ferrodyn.compile(fn, backend=backend, fullgraph=True)
        for _ in range(2):  # second call: a cache hit, same result
            assert_same(fn(*args), compiled(*args))
    finally:
        ferrodyn.reset()
    assert len(graphs) <= 1  # one graph (none when the program has no tensor op left)

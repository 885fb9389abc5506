"""Hypothesis-generated programs with graph breaks at random points (explicit breaks, prints,
data-dependent branches, `.item()`, stack instructions on values the converter does not model:
an attribute of a deque, a tensor formatted into a string), inside loops, grad-mode blocks and inlined helpers,
compiled with ferrodyn and compared with eager: results, requires_grad, grad mode after."""

import collections
import textwrap

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ferrodyn
from counting_backend import CountingBackend

_HELPER = '''
def helper(t):
    t = t * 1.5
    BREAK
    return t - 0.25
'''

_STATEMENTS = [
    "x = x * 2 + 1",
    "y = torch.sin(x) + y",
    "x = x - y.mean()",
    "acc.append(x.sum())",
    "BREAK",
    "if x.sum() > 0:\n    x = x - 1\nelse:\n    x = x + 1",
    "if y.sum().item() > 0.5:\n    y = y * 0.5",
    "for i in range(2):\n    x = x + i\n    BREAK",
    "with torch.no_grad():\n    z = x * 3\n    BREAK\n    y = y + z",
    "x = helper(x)",
]
_BREAKS = ["torch._dynamo.graph_break()", "ferrodyn.graph_break()", "print(end='')",
           "_DQ.maxlen", "f'{torch.ones(2) * 3!r}'"]


def _program(stmts: list[int], breaks: list[int]) -> str:
    body = []
    k = 0
    for s in stmts:
        text = _STATEMENTS[s]
        while "BREAK" in text:
            text = text.replace("BREAK", _BREAKS[breaks[k % len(breaks)]], 1)
            k += 1
        body.append(text)
    helper = _HELPER.replace("BREAK", _BREAKS[breaks[0]])
    src = "def f(x, y):\n    acc = []\n" + textwrap.indent("\n".join(body), "    ")
    src += "\n    return x, y, acc, torch.is_grad_enabled()\n"
    return helper + src


def _build(src: str):
    ns = {"torch": torch, "ferrodyn": ferrodyn, "_DQ": collections.deque()}
    exec(compile(src, "<graph-break program>", "exec"), ns)
    return ns["f"]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert a.requires_grad == b.requires_grad
        torch.testing.assert_close(a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    else:
        assert a == b


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stmts=st.lists(st.integers(0, len(_STATEMENTS) - 1), min_size=1, max_size=6),
       breaks=st.lists(st.integers(0, len(_BREAKS) - 1), min_size=1, max_size=3),
       grad=st.booleans(), seed=st.integers(0, 3))
def test_random_programs_with_breaks_match_eager(stmts, breaks, grad, seed):
    src = _program(stmts, breaks)
    fn = _build(src)
    torch.manual_seed(seed)
    x, y = torch.randn(3, requires_grad=grad), torch.randn(3)
    want = fn(x, y)
    ferrodyn.reset()
    compiled = ferrodyn.compile(fn, backend=CountingBackend())
    for _ in range(2):
        _same(compiled(x, y), want)
        assert torch.is_grad_enabled()

"""Graph breaks after mutations of pre-existing state: the side-effects table is replayed before
the breaking instruction runs eagerly (the instruction sees every earlier mutation), and the
values live across the break are read before the replay (a local that held `o.items` still
holds the old list after `o.items = [...]`). Each case runs eagerly and compiled on fresh,
equal state, compared after every call (results, the mutated objects, what the eager region
saw), with graph counts against torch.compile's."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class Box:
    def __init__(self):
        self.items = [1, 2]
        self.n = 0


def observe(seen, *values):
    """A graph break (in both compilers), then records what it is shown, as copies."""
    torch._dynamo.graph_break()
    seen.append(tuple(list(v) if isinstance(v, list) else v for v in values))


def append_then_break(x, xs, seen):
    xs.append(3)
    y = x + 1
    observe(seen, xs, len(xs))
    xs.append(4)
    return y * len(xs)


def attr_swap_then_break(x, box, seen):
    old = box.items
    box.items = [9]
    box.n = box.n + 1
    y = x * 2
    observe(seen, old, box.items, box.n)
    return y + len(old), old


def dict_update_then_break(x, d, seen):
    d["a"] = d.get("a", 0) + 1
    y = x - 1
    observe(seen, sorted(d.items()))
    d["b"] = 2
    return y


def _state(args):
    out = []
    for a in args:
        if isinstance(a, Box):
            out.append(("Box", list(a.items), a.n))
        elif isinstance(a, (list, dict)):
            out.append(repr(a))
        elif isinstance(a, torch.Tensor):
            out.append(a.clone())
    return out


def _fresh(fn):
    x = torch.arange(4.0)
    if fn is attr_swap_then_break:
        return [x, Box(), []]
    if fn is dict_update_then_break:
        return [x, {"z": 0}, []]
    return [x, [1, 2], []]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for p, q in zip(a, b):
            _same(p, q)
    else:
        assert a == b, (a, b)


@pytest.mark.parametrize("fn", [append_then_break, attr_swap_then_break, dict_update_then_break],
                         ids=lambda f: f.__name__)
def test_break_after_mutation_matches_eager(fn):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    compiled = ferrodyn.compile(fn, backend=ours)
    by_torch = torch.compile(fn, backend=theirs)
    for _ in range(3):
        eager_args, our_args, torch_args = _fresh(fn), _fresh(fn), _fresh(fn)
        want = fn(*eager_args)
        got = compiled(*our_args)
        by_torch(*torch_args)
        _same(got, want)
        _same(_state(our_args), _state(eager_args))
        assert our_args[-1] == eager_args[-1]  # what the eager region saw
        if isinstance(want, tuple):  # `old` is the very list the object held before
            assert got[1] is not our_args[1].items
    assert 1 <= ours.count <= theirs.count, (ours.count, theirs.count)

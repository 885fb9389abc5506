"""Graph breaks inside `for` loops: the loop's iterator is live across the break. It may be
passed to the resume function as its remaining items only when nothing can change what it
still produces; otherwise (map, filter, iterators over lists and dicts from outside the frame)
it goes over as CPython's own iterator at its position, or is refused (resume/loops.py;
tests/test_graph_breaks_lazy_iterators.py), never rebuilt wrongly. Each case: compiled ==
eager over repeated calls, state included."""

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def step(x, i):
    torch._dynamo.graph_break()
    return x * (i + 2)


def loop_enumerate(x, ws, box):
    for i, w in enumerate(ws):
        x = step(x + w, i)
    return x


def loop_zip(x, ws, box):
    for i, w in zip(range(10), ws):
        x = step(x + w, i)
    return x


def loop_reversed(x, ws, box):
    for w in reversed(ws):
        x = step(x + w, 1)
    return x


def loop_map(x, ws, box):
    for w in map(lambda t: t * 2, ws):
        x = step(x + w, 0)
    return x


def loop_filter(x, ws, box):
    for w in filter(lambda t: True, ws):
        x = step(x + w, 0)
    return x


def loop_dict_items(x, ws, box):
    for k, w in {"a": ws[0], "b": ws[1]}.items():
        x = step(x + w, len(k))
    return x


def loop_outside_list_grows(x, ws, box):
    for w in box.ws:  # a list from outside the frame, appended to after the break
        x = step(x + w, 0)
        if len(box.ws) < 5:
            box.ws.append(w + 1)
    return x


def loop_new_list(x, ws, box):
    for w in [ws[0], ws[1] * 2, ws[2]]:  # a private list: its iterator resumes
        x = step(x + w, 0)
    return x


class Box:
    def __init__(self, ws):
        self.ws = list(ws)


def _args():
    ws = [torch.full((2,), float(k)) for k in range(3)]
    return torch.ones(2), ws, Box(ws)


CASES = [loop_enumerate, loop_zip, loop_reversed, loop_map, loop_filter, loop_dict_items,
         loop_outside_list_grows, loop_new_list]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_break_in_loop_matches_eager(fn):
    backend = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=backend)
    for _ in range(3):
        eager_args, our_args = _args(), _args()
        want = fn(*eager_args)
        got = compiled(*our_args)
        torch.testing.assert_close(got, want)
        assert len(our_args[2].ws) == len(eager_args[2].ws)
        for a, b in zip(our_args[2].ws, eager_args[2].ws):
            torch.testing.assert_close(a, b)
    if fn is loop_new_list:
        assert backend.count >= 2  # the private list's iterator resumed inside the loop

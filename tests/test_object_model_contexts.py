"""Context managers in traced code: `contextlib.contextmanager` generators (body up to the
yield on enter, the rest on exit), `contextlib.nullcontext`, user classes with
`__enter__`/`__exit__`; an exception inside the body leaves the frame to eager, which raises.
Compiled vs eager, graph counts beside torch.compile's."""

import contextlib

import pytest
import torch

from compiled_vs_eager import check_one_graph_like_torch, run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


@contextlib.contextmanager
def scaled(x, k=2, *, log=None):
    if log is not None:
        log.append("enter")
    y = x * k
    try:
        yield y
    finally:
        if log is not None:
            log.append("exit")


@contextlib.contextmanager
def plain():
    yield


class Tracker:
    def __init__(self):
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        return False


def with_contextmanager(x):
    with scaled(x, 3) as y:
        z = y + 1
    return z


def with_contextmanager_log(x):
    log = []
    with scaled(x, k=4, log=log) as y:
        log.append("body")
        z = y * 2
    return z, log


def nested_contexts(x):
    with plain(), scaled(x) as y, contextlib.nullcontext(y + 1) as w:
        return y + w


def return_inside(x):
    with scaled(x) as y:
        return y - 1


def user_class(x):
    t = Tracker()
    with t as tt:
        inside = tt.depth
    return x + inside + t.depth


CASES = [with_contextmanager, with_contextmanager_log, nested_contexts, return_inside, user_class]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_context_managers(fn):
    check_one_graph_like_torch(fn, torch.ones(3))


def raises_in_body(x):
    with scaled(x) as y:
        raise ValueError("inside")
    return y


def generator_without_yield(x):
    @contextlib.contextmanager
    def empty():
        if False:
            yield
    with empty():
        pass
    return x


@pytest.mark.parametrize("fn", [raises_in_body, generator_without_yield])
def test_context_manager_errors_raise_as_in_eager(fn):
    run_all(fn, torch.ones(2))

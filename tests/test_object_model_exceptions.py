"""try/except/finally in traced code where the raise is decided at trace time: handlers,
`except ... as e`, `finally`, `else`, re-raise, exceptions raised in inlined calls and caught by
the caller, and uncaught ones (the frame runs eagerly and raises as eager does). Compiled vs
eager, graph counts beside torch.compile's."""

import pytest
import torch

from compiled_vs_eager import check_one_graph_like_torch, run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


class MyError(ValueError):
    pass


def _raiser(x, kind):
    if kind == "value":
        raise ValueError("bad", 3)
    if kind == "mine":
        raise MyError("mine")
    return x * 5


def caught(x):
    try:
        raise ValueError("a")
    except ValueError:
        x = x + 1
    return x


def caught_as(x):
    try:
        x = x * 2
        raise KeyError("k", 4)
    except (TypeError, KeyError) as e:
        x = x + e.args[1]
    return x


def finally_runs(x):
    try:
        raise ValueError("a")
    except ValueError:
        x = x + 1
    finally:
        x = x * 3
    return x


def else_branch(x):
    try:
        y = x + 1
    except ValueError:
        y = x - 1
    else:
        y = y * 2
    return y


def from_inlined_call(x):
    try:
        return _raiser(x, "value")
    except ValueError as e:
        return x + len(e.args)


def subclass_caught(x):
    try:
        _raiser(x, "mine")
    except ValueError:
        return x - 7
    return x


def nested_reraise(x):
    try:
        try:
            raise MyError("inner")
        except MyError:
            x = x + 1
            raise
    except ValueError:
        x = x * 10
    return x


def no_raise_in_inlined(x):
    try:
        return _raiser(x, "none")
    except ValueError:
        return x


def raise_class(x):
    try:
        raise IndexError
    except IndexError:
        return x + 2


CAUGHT = [caught, caught_as, finally_runs, else_branch, from_inlined_call, subclass_caught,
          nested_reraise, no_raise_in_inlined, raise_class]


@pytest.mark.parametrize("fn", CAUGHT, ids=[f.__name__ for f in CAUGHT])
def test_exceptions_handled_in_the_traced_code(fn):
    check_one_graph_like_torch(fn, torch.ones(3))


def uncaught(x):
    y = x + 1
    raise MyError("out")


def wrong_handler(x):
    try:
        raise KeyError("k")
    except ValueError:
        return x
    return x + 1


def raise_in_finally_path(x):
    try:
        raise TypeError("t")
    finally:
        x = x + 1


@pytest.mark.parametrize("fn", [uncaught, wrong_handler, raise_in_finally_path])
def test_exceptions_not_handled_raise_as_in_eager(fn):
    run_all(fn, torch.ones(2))  # compares the exception type with eager's

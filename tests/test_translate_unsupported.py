"""Constructs the converter refuses: each raises Unsupported with its BreakReason and the
user's file and line (the innermost inlined function's), and never returns a wrong graph."""

import inspect
import threading

import pytest
import torch

from ferrodyn.exc import BreakReason, Unsupported
from translate_harness import trace

G = 0


class Obj:
    def __init__(self):
        self.v = 1


def data_dependent_if(x):
    if x.sum() > 0:  # LINE
        return x
    return -x


def item_of_input(x):
    return x * x.max().item()  # LINE


def prints(x):
    print(x)  # LINE
    return x


def raises(x):
    raise ValueError("no")  # LINE


def try_except(x):
    try:
        y = x + 1
        raise KeyError  # LINE
    except ValueError:  # a handler that does not match: the KeyError is not handled
        y = x
    return y


def generator_fn(x):
    yield x  # LINE: where throw() raises it


def uses_generator(x):
    g = generator_fn(x)  # traced (variables/generators.py); throw() raises at the yield
    next(g)
    return g.throw(ValueError)  # the body does not handle it: uncaught


class Logged(threading.local):  # a __setattr__ in C (per-thread storage): refused
    pass


class Slotted:
    __slots__ = ("v",)


def sets_attr_with_custom_setattr(x, o):
    o.v = 2  # LINE
    return x


def sets_slot_on_input(x, o):
    o.v = 2  # LINE
    return x


def replaces_module_internals(x, m):
    m._modules = {}  # LINE (a container nn.Module lookups read, replaced: not modelled)
    return x


def extends_input_set(x, s):
    t = {x, x * 2, x * 3}
    t.discard(x)  # t's order now depends on the tensors' addresses and on its history
    s |= t  # LINE
    return x


def inner(x):
    return bool(x.any())  # LINE


def outer_calls_inner(x):
    return inner(x)


def nonzero(x):
    return x.nonzero()  # LINE


def set_of_tensors(x):
    for t in {x, x * 2}:  # LINE
        x = x + t  # the order of a set of new tensors is not known at trace time
    return x


def tensor_requires_grad_set(x):
    x.requires_grad = True  # LINE
    return x


def _line_of(fn):
    src, start = inspect.getsourcelines(fn)
    for i, line in enumerate(src):
        if "# LINE" in line:
            return start + i
    raise AssertionError(fn)


CASES = [
    (data_dependent_if, (torch.randn(3),), BreakReason.DATA_DEPENDENT, data_dependent_if),
    (item_of_input, (torch.randn(3),), BreakReason.DATA_DEPENDENT, item_of_input),
    (prints, (torch.randn(3),), BreakReason.UNSUPPORTED_CALL, prints),
    (raises, (torch.randn(3),), BreakReason.EXCEPTION, raises),
    (try_except, (torch.randn(3),), BreakReason.EXCEPTION, try_except),
    (uses_generator, (torch.randn(3),), BreakReason.EXCEPTION, generator_fn),
    (sets_attr_with_custom_setattr, (torch.randn(3), Logged()), BreakReason.UNSUPPORTED_CALL,
     sets_attr_with_custom_setattr),
    (sets_slot_on_input, (torch.randn(3), Slotted()), BreakReason.SIDE_EFFECT,
     sets_slot_on_input),
    (replaces_module_internals, (torch.randn(3), torch.nn.Linear(1, 1)),
     BreakReason.SIDE_EFFECT, replaces_module_internals),
    (extends_input_set, (torch.randn(3), {3}), BreakReason.SIDE_EFFECT, extends_input_set),
    (outer_calls_inner, (torch.randn(3),), BreakReason.DATA_DEPENDENT, inner),
    (nonzero, (torch.randn(3),), BreakReason.DATA_DEPENDENT, nonzero),
    (set_of_tensors, (torch.randn(3),), BreakReason.UNSUPPORTED_TYPE, set_of_tensors),
    (tensor_requires_grad_set, (torch.randn(3),), BreakReason.SIDE_EFFECT,
     tensor_requires_grad_set),
]


@pytest.mark.parametrize("fn,args,reason,where", CASES, ids=[c[0].__name__ for c in CASES])
def test_refused_with_reason_and_location(fn, args, reason, where):
    with pytest.raises(Unsupported) as info:
        trace(fn, *args)
    e = info.value
    assert e.reason is reason, (e.reason, str(e))
    assert e.filename == __file__
    assert e.lineno == _line_of(where)
    assert f"{__file__}:{e.lineno}" in str(e)
    assert isinstance(e, torch._dynamo.exc.Unsupported)


def test_generator_frame_refused():
    with pytest.raises(Unsupported) as info:
        trace(generator_fn, torch.randn(2))
    assert info.value.reason is BreakReason.GENERATOR

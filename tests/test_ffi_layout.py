"""Layouts of the CPython structs ferrodyn mirrors in rust/ffi (frame part): `PyCodeObject`'s
head, `_PyInterpreterFrame` and (3.12+) `PyThreadState` (mirrors per minor in
rust/ffi/frame311.rs, frame312.rs, frame313.rs), each read through its mirror by a
`_C._debug_*` function and compared with what Python reports for the same object."""

import builtins
import sys
import threading

import pytest

from ferrodyn import _C
from hook_helpers import callback


def plain(a, b):
    return a + b


def many(a, b=1, /, c=2, *args, d, e=5, **kw):
    x = a + b
    return x


def make_closure():
    y, z = 1, 2

    def inner(a):
        return a + y + z
    return inner


def cellarg(a, b):
    def g():
        return a
    return g() + b


async def acoro(x):
    return x


def agen():
    yield 1


CODES = [plain, many, make_closure(), cellarg, acoro, agen, make_closure]


def nlocalsplus(code):
    # Arguments that are also cells appear once in localsplus.
    return len(set(code.co_varnames) | set(code.co_cellvars)) + len(code.co_freevars)


@pytest.mark.parametrize("fn", CODES, ids=lambda f: f.__name__)
def test_code_head_mirror(fn):
    code = fn.__code__
    got = _C._debug_code_fields(code)
    assert got["co_flags"] == code.co_flags
    assert got["co_argcount"] == code.co_argcount
    assert got["co_posonlyargcount"] == code.co_posonlyargcount
    assert got["co_kwonlyargcount"] == code.co_kwonlyargcount
    assert got["co_stacksize"] == code.co_stacksize
    assert got["co_firstlineno"] == code.co_firstlineno
    assert got["co_nlocals"] == code.co_nlocals
    assert got["co_nfreevars"] == len(code.co_freevars)
    assert got["co_ncellvars"] == len(code.co_cellvars)
    assert got["co_nlocalsplus"] == nlocalsplus(code)
    if sys.version_info >= (3, 12):
        # FRAME_SPECIALS_SIZE: (sizeof(_PyInterpreterFrame) - 1) / sizeof(PyObject *) = 9 words.
        assert got["co_framesize"] == got["co_nlocalsplus"] + code.co_stacksize + 9


@pytest.mark.parametrize("fn,args,kwargs", [
    (plain, (1, 2), {}),
    (many, (1, 2, 3, 4), {"d": 6, "q": 7}),
    (make_closure(), (5,), {}),
    (cellarg, (8, 9), {}),
])
def test_interpreter_frame_mirror(fn, args, kwargs):
    views = []

    def cb(view):
        if view.f_code is fn.__code__:
            views.append((view, _C._debug_last_frame()))
        return None

    with callback(cb):
        expected = fn(*args, **kwargs)
    assert fn(*args, **kwargs) == expected
    ((view, raw),) = views
    # Fields read through the frame mirror, compared with the function object.
    assert view.f_code is fn.__code__
    assert view.f_globals is fn.__globals__
    assert view.f_builtins is builtins.__dict__
    assert view.closure is fn.__closure__ or view.closure == fn.__closure__
    code = fn.__code__
    import inspect
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    assert view.f_locals == {k: v for k, v in bound.arguments.items()}
    assert len(view.args) == code.co_argcount + code.co_kwonlyargcount + \
        bool(code.co_flags & 4) + bool(code.co_flags & 8)
    # Raw fields of the frame when the hook sees it: thread-owned (owner 0), not started
    # (stacktop = co_nlocalsplus), no frame object, no locals dict, on top of the data stack.
    assert raw["owner"] == 0
    assert raw["stacktop"] == raw["co_nlocalsplus"] == nlocalsplus(code)
    assert raw["frame_obj_is_null"] == 1 and raw["f_locals_is_null"] == 1
    assert raw["stack_top_ok"] == 1


def test_thread_state_trace_fields():
    """`c_tracefunc` / `c_profilefunc` read through the PyThreadState mirror (every minor):
    the direct call of a cached entry (rust/cache/direct.rs) is not taken while either is
    set."""
    def traced():
        return _C._debug_hook_state()["thread_traced"]

    assert traced() is False
    for setter in (sys.settrace, sys.setprofile):
        setter(lambda *a: None)
        try:
            on = traced()
        finally:
            setter(None)
        assert on is True and traced() is False
    # per thread: another thread with a profile function, this one without
    seen = {}

    def worker():
        sys.setprofile(lambda *a: None)
        seen["worker"] = traced()
        sys.setprofile(None)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["worker"] is True and traced() is False


def test_thread_state_mirror():
    def ids():
        return _C._debug_hook_state()["thread_ids"]

    assert ids() == (threading.get_ident(), threading.get_native_id())
    out = {}
    t = threading.Thread(target=lambda: out.update(ids=ids(), want=(threading.get_ident(),
                                                                     threading.get_native_id())))
    t.start()
    t.join()
    assert out["ids"] == out["want"]

"""Helpers shared by tests/test_eval_frame.py and tests/test_cache.py: guard trees for the
frame hook's tests and a context manager that installs a callback for a block."""

from __future__ import annotations

import os

from ferrodyn import _C


_TESTS = os.path.dirname(os.path.abspath(__file__))


def always_tree():
    """A tree with no leaves: passes for every frame."""
    return _C.GuardBuilder().build()


def type_tree(index: int, name: str, typ: type):
    """`type(L[name]) is typ` on argument slot `index`."""
    b = _C.GuardBuilder()
    b.type_is(b.local(index, name), typ)
    return b.build()


class callback:
    """`with callback(cb):` sets this thread's callback for the block and restores the previous
    one. Its own `__exit__` is marked SKIP so the callback never sees it."""

    def __init__(self, cb):
        self.cb = cb

    def __enter__(self):
        _C.skip_code(type(self).__exit__.__code__)
        self.prev = _C.set_eval_frame(self.cb)
        return self.cb

    def __exit__(self, *exc):
        _C.set_eval_frame(self.prev)
        return False


class Recorder:
    """A callback that records the frame views it sees and returns `entry_for(view)`."""

    def __init__(self, entry_for=lambda view: None):
        self.views = []
        self.entry_for = entry_for

    def __call__(self, view):
        # Only the tests' own functions (not contextlib's __exit__ or pytest's machinery).
        if not view.f_code.co_filename.startswith(_TESTS) or view.f_code.co_filename == __file__:
            return None
        self.views.append(view)
        return self.entry_for(view)

    def names(self):
        return [v.f_code.co_name for v in self.views]

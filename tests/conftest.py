"""Shared pytest fixtures. Tests import the in-place build from python/ (see the Makefile)."""

import pytest


@pytest.fixture(autouse=True)
def _hook_off_after_test():
    """No test may leave a frame callback installed on this thread."""
    yield
    from ferrodyn import _C
    _C.set_eval_frame(None) if hasattr(_C, "set_eval_frame") else None

"""Shared pytest fixtures. Tests import the in-place build from python/ (see the Makefile)."""

import pytest


@pytest.fixture(autouse=True)
def _hook_off_after_test():
    """No test may leave a frame callback installed on this thread."""
    yield
    from ferrodyn import _C
    _C.set_eval_frame(None) if hasattr(_C, "set_eval_frame") else None


@pytest.fixture
def clean_hook_cache():
    """Every Rust cache entry, flag and counter cleared and the default limit set, before and
    after the test (for tests that count hits, misses and entries)."""
    from ferrodyn import _C
    _C.reset()
    _C.set_cache_size_limit(8)
    yield
    _C.set_eval_frame(None)
    _C.reset()
    _C.set_cache_size_limit(8)


@pytest.fixture
def fresh_ferrodyn():
    """ferrodyn.reset() before and after the test: no cache entry, skip flag or compiled state
    leaks between end-to-end tests."""
    import ferrodyn
    ferrodyn.reset()
    yield
    ferrodyn.reset()

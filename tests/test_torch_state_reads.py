"""Torch process state read in a compiled frame through a call or a torch module's object:
after the state changes, the compiled function returns what eager returns (a wrong value
before: the first trace's answer was baked in with no guard), and graph counts match
torch.compile's where torch.compile captures it in one graph too."""
import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend


def _flip_threads():
    n = torch.get_num_threads()
    torch.set_num_threads(1 if n > 1 else 2)
    return lambda: torch.set_num_threads(n)


def _flip_anomaly():
    was = torch.is_anomaly_enabled()
    torch.set_anomaly_enabled(not was)
    return lambda: torch.set_anomaly_enabled(was)


def _flip_matmul_precision():
    was = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if was == "highest" else "highest")
    return lambda: torch.set_float32_matmul_precision(was)


def _flip_warn_always():
    was = torch.is_warn_always_enabled()
    torch.set_warn_always(not was)
    return lambda: torch.set_warn_always(was)


def _flip_autocast_cache():
    was = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(not was)
    return lambda: torch.set_autocast_cache_enabled(was)


def _flip_print_precision():
    was = torch._tensor_str.PRINT_OPTS.precision
    torch.set_printoptions(precision=was + 3)
    return lambda: torch.set_printoptions(precision=was)


CASES = {
    "num_threads": (lambda x: x + torch.get_num_threads(), _flip_threads),
    "anomaly": (lambda x: x + int(torch.is_anomaly_enabled()), _flip_anomaly),
    "matmul_precision": (lambda x: x + len(torch.get_float32_matmul_precision()),
                         _flip_matmul_precision),
    "warn_always": (lambda x: x + int(torch.is_warn_always_enabled()), _flip_warn_always),
    "autocast_cache": (lambda x: x * 2 if torch.is_autocast_cache_enabled() else x - 1,
                       _flip_autocast_cache),
    "print_precision": (lambda x: x + torch._tensor_str.PRINT_OPTS.precision,
                        _flip_print_precision),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_change_after_compile_is_seen(fresh_ferrodyn, name):
    fn, flip = CASES[name]
    compiled = ferrodyn.compile(fn, backend=CountingBackend())
    x = torch.arange(4.0)
    assert torch.equal(compiled(x), fn(x))
    restore = flip()
    try:
        assert torch.equal(compiled(x), fn(x))
    finally:
        restore()
    assert torch.equal(compiled(x), fn(x))


def test_pure_and_guarded_calls_still_fold(fresh_ferrodyn):
    """Calls that read only their arguments or guarded state stay in one graph, as in
    torch.compile."""
    def fn(x):
        dt = torch.promote_types(torch.float16, torch.float32)
        if torch.is_autocast_enabled("cpu") or not torch.cuda.is_available():
            x = x + 1
        return x.to(dt) * torch.get_default_dtype().itemsize

    ours, theirs = CountingBackend(), CountingBackend()
    x = torch.arange(4.0)
    assert torch.equal(ferrodyn.compile(fn, backend=ours)(x), fn(x))
    assert torch.equal(torch.compile(fn, backend=theirs)(x), fn(x))
    assert ours.count == theirs.count == 1


def test_unguarded_state_read_breaks_the_graph(fresh_ferrodyn):
    """A getter of state no guard checks is not folded: the graph breaks at it and the call
    runs eagerly, the value right on every call."""
    def fn(x):
        y = x.sin()
        return y + torch.get_num_threads()

    backend = CountingBackend()
    compiled = ferrodyn.compile(fn, backend=backend)
    x = torch.arange(3.0)
    assert torch.equal(compiled(x), fn(x))
    assert backend.count == 2
    restore = _flip_threads()
    try:
        assert torch.equal(compiled(x), fn(x))
    finally:
        restore()

"""The global-state leaf (rust/guards/global_state.rs): grad mode, default dtype, deterministic
algorithms and autocast (enabled, dtype) each true and false with its explanation, read
without Python calls where torch's own readers verified."""

import contextlib

import pytest
import torch

from ferrodyn import _C


def state_tree():
    b = _C.GuardBuilder()
    b.global_state()
    return b.build()


@contextlib.contextmanager
def default_dtype(d):
    old = torch.get_default_dtype()
    torch.set_default_dtype(d)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def deterministic(mode):
    old = torch.are_deterministic_algorithms_enabled()
    warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(mode)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old, warn_only=warn)


CHANGES = [
    ("grad off", torch.no_grad, "torch.is_grad_enabled() == True (got False)"),
    ("default dtype", lambda: default_dtype(torch.float64), "torch.get_default_dtype() == torch.float32 (got torch.float64)"),
    ("deterministic", lambda: deterministic(True), "torch.are_deterministic_algorithms_enabled() == False (got True)"),
    ("autocast on", lambda: torch.autocast("cpu"), "torch.is_autocast_enabled('cpu') == False (got True)"),
    ("autocast dtype", lambda: torch.autocast("cpu", enabled=False, dtype=torch.float16),
     "torch.get_autocast_dtype('cpu') == torch.bfloat16 (got torch.float16)"),
]


def test_direct_readers_verified():
    assert _C._global_state_fast_path() is True


def test_describes_the_captured_state():
    (leaf,) = state_tree().leaves()
    assert leaf.startswith("global_state(grad_enabled=True, default_dtype=torch.float32, "
                           "deterministic_algorithms=False, autocast_cpu=(False, torch.bfloat16)")


@pytest.mark.parametrize("change, why", [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_each_component_true_and_false(change, why):
    tree = state_tree()
    assert tree.check(()) and tree.explain(()) is None
    with change():
        assert tree.check(()) is False
        assert tree.explain(()) == why
    assert tree.check(())


@pytest.mark.parametrize("change", [c[1] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_captured_inside_the_changed_state(change):
    with change():
        tree = state_tree()
        assert tree.check(())
    assert tree.check(()) is False
    assert tree.explain(()) is not None


def test_grad_mode_is_per_thread():
    import threading

    tree = state_tree()
    seen = []
    with torch.no_grad():
        t = threading.Thread(target=lambda: seen.append(tree.check(())))
        t.start()
        t.join()
        assert tree.check(()) is False
    assert seen == [True]


FIRST_USE_IN_ODD_STATE = r"""
import torch
from ferrodyn import _C
torch.set_default_dtype(torch.float64)
torch.use_deterministic_algorithms(True, warn_only=True)
with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
    before = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(), torch.is_autocast_enabled("cpu"),
              torch.get_autocast_dtype("cpu"))
    with torch.inference_mode():
        assert _C.tensor_fast_path(), _C._tensor_fast_path_failure()  # calibration happens here
    b = _C.GuardBuilder()
    b.global_state()  # the readers are verified here, toggling and restoring the state
    tree = b.build()
    after = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.is_autocast_enabled("cpu"),
             torch.get_autocast_dtype("cpu"))
    assert before == after, (before, after)
    assert _C._global_state_fast_path()
    assert tree.check(()), tree.explain(())
assert tree.explain(()) == "torch.is_grad_enabled() == False (got True)"
print("ok")
"""


def test_first_use_in_a_changed_state_restores_it():
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FIRST_USE_IN_ODD_STATE], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]

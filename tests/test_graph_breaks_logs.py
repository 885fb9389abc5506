"""`FERRODYN_LOGS=graph_breaks` (issue 8): each break that resumes is logged once per (code,
instruction), with its reason and the user's stack (file:line of each frame, innermost last);
the graph counts are torch.compile's (nested: with nested_graph_breaks)."""

import logging
import os
import subprocess
import sys

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from ferrodyn import logs

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


@pytest.fixture
def break_logs():
    logs.set_logs("graph_breaks", handler=False)
    yield
    logs.set_logs("", handler=False)


def helper(y):
    y = y + 1
    print("logged break")
    return y * 2


def outer(x):
    return helper(x.sin()).cos()


def _records(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "ferrodyn.graph_breaks"]


def test_each_break_is_logged_once_with_reason_and_user_stack(break_logs, caplog):
    caplog.set_level(logging.DEBUG, logger="ferrodyn.graph_breaks")
    ours = CountingBackend()
    c = ferrodyn.compile(outer, backend=ours)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(c(x), outer(x))
    c(torch.randn(2, 2))  # a recompile meets the same break: not logged again
    (msg,) = _records(caplog)
    call_line = outer.__code__.co_firstlineno + 1
    print_line = helper.__code__.co_firstlineno + 2
    assert f"Graph break in user code at {__file__}:{print_line}" in msg
    assert "print" in msg.split("Reason:")[1].splitlines()[0]
    tb = msg.split("User code traceback:")[1]
    assert tb.index(f'line {call_line}, in outer') < tb.index(f'line {print_line}, in helper')
    with torch._dynamo.config.patch(nested_graph_breaks=True):
        torch._dynamo.reset()
        theirs = CountingBackend()
        t = torch.compile(outer, backend=theirs)
        t(x), t(x), t(torch.randn(2, 2))
    assert ours.count == theirs.count == 4


def test_silent_unless_enabled(caplog):
    caplog.set_level(logging.INFO, logger="ferrodyn")
    ferrodyn.compile(outer, backend=CountingBackend())(torch.randn(3))
    assert _records(caplog) == []


def test_environment_switch_enables_the_channel():
    code = ("import ferrodyn.logs as l, logging;"
            "print(logging.getLogger('ferrodyn.graph_breaks').isEnabledFor(logging.DEBUG))")
    env = dict(os.environ, FERRODYN_LOGS="graph_breaks")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "True"

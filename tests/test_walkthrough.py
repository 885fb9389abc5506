"""docs/walkthrough.py, the one-page tour of ferrodyn's loop, runs to the end: each of its steps
asserts what it shows (frame hook, TraceResult, entry function, guard tree, cache hit, recompile,
make_fx, weak dictionaries), so a change that breaks the story breaks this test."""

import pathlib
import runpy

import pytest

import ferrodyn
from ferrodyn import _C

WALKTHROUGH = pathlib.Path(__file__).resolve().parent.parent / "docs" / "walkthrough.py"



pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def test_walkthrough_runs_to_the_end(capsys):
    ns = runpy.run_path(str(WALKTHROUGH), run_name="walkthrough")
    out = capsys.readouterr().out
    assert "every step checked" in out
    # It left nothing installed and looked at what it claims to show.
    assert _C.get_eval_frame() is None
    assert len(ns["backend"].graphs) >= 3 and ns["report"].graph_count == 1
    assert ns["why_shape"] == "L['x'].size()[0] == 3 (got 5)"
    titles = ("the frame hook", "bytecode -> graph", "the entry function", "guards",
              "the loop, by hand", "ferrodyn.compile", "recompiles", "make_fx", "weak dictionaries")
    for i, title in enumerate(titles, 1):
        assert f"=== {i}. {title} " in out


def test_walkthrough_stays_one_page():
    lines = WALKTHROUGH.read_text().splitlines()
    assert 250 <= len(lines) <= 500
    assert lines[0].startswith('"""')  # opens with what it is

"""Graph breaks inside `with torch.autocast(...)` (issue 8): the graph before the break exits
the live autocast blocks, the breaking instruction runs eagerly inside the same autocast, and
the resume function enters it again in its own graph and leaves it where the original does.
Each test compares ferrodyn with eager (values, dtypes, the autocast state seen by the
instruction run at the break and left after the call) and with torch.compile's graph count."""

import warnings

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

SEEN = []


def probe(tag):
    """Records the autocast state it runs under; its print breaks the graph (the call is
    made eagerly by the entry: an enclosing autocast `with` keeps it from resuming inside)."""
    SEEN.append((tag, torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
    print(tag)


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    else:
        assert got == want


def run_both(fn, *args, calls=3, at_most_torch=True, torch_may_fail=False):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    cf = ferrodyn.compile(fn, backend=ours)
    counts = []
    for _ in range(calls):
        SEEN.clear()
        want, seen_eager = fn(*args), list(SEEN)
        SEEN.clear()
        got = cf(*args)
        _same(got, want)
        assert SEEN == seen_eager
        assert not torch.is_autocast_enabled("cpu")
        counts.append(ours.count)
    assert counts[-1] == counts[1], counts  # no recompile after the first call
    try:
        torch.compile(fn, backend=theirs)(*args)
    except torch._dynamo.exc.InternalTorchDynamoError:
        if not torch_may_fail:
            raise
        return ours, None
    if at_most_torch:  # torch.compile runs a frame with a break inside `try` eagerly
        assert ours.count <= theirs.count, (ours.count, theirs.count)
    return ours, theirs


def simple(x):
    with torch.autocast("cpu"):
        y = x @ x
        print("a")
        z = y @ y
    return z, y.dtype, torch.is_autocast_enabled("cpu")


def test_break_inside_autocast(capsys):
    ours, theirs = run_both(simple, torch.randn(4, 4))
    assert ours.count == theirs.count == 2


def nested_blocks(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
        with torch.amp.autocast("cpu", enabled=False):
            w = y.float() @ x
            probe("inner")
            w2 = w @ x
        z = y @ y
        probe("outer")
    return z, w, w2


def test_nested_autocast_blocks_enabled_and_disabled(capsys):
    ours, _ = run_both(nested_blocks, torch.randn(4, 4))
    assert ours.count == 3


def dtype_and_cache(x):
    with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
        y = x @ x
        probe("f16")
        z = y @ x
    return z, y


def test_autocast_dtype_and_cache_flag(capsys):
    run_both(dtype_and_cache, torch.randn(4, 4))


def data_dependent(x):
    with torch.amp.autocast("cpu"):
        y = x @ x
        if y.sum() > 0:
            y = y @ y
        else:
            y = y @ x
    return y.float() @ x, torch.is_autocast_enabled("cpu")


def test_data_dependent_jump_inside_autocast():
    for x in (torch.eye(4), -torch.eye(4)):
        run_both(data_dependent, x)


def raising(tag):
    SEEN.append((tag, torch.is_autocast_enabled("cpu")))
    print(tag)
    raise ValueError(tag)


def exception_inside(x):
    with torch.autocast("cpu"):
        y = x @ x
        try:
            raising("boom")
        except ValueError:
            y = y @ x
    return y, torch.is_autocast_enabled("cpu")


def test_exception_from_the_instruction_inside_autocast(capsys):
    run_both(exception_inside, torch.randn(4, 4), at_most_torch=False)


def exception_out(x):
    with torch.autocast("cpu"):
        y = x @ x
        raising("out")
    return y


def test_exception_leaving_the_autocast_block(capsys):
    cf = ferrodyn.compile(exception_out, backend=CountingBackend())
    for _ in range(2):
        with pytest.raises(ValueError, match="out"):
            cf(torch.randn(4, 4))
        assert not torch.is_autocast_enabled("cpu")


def helper_in_autocast(x):
    with torch.autocast("cpu"):
        y = x @ x
        print("inner")
        return y @ y


def calls_helper(x):
    return helper_in_autocast(x * 2) + 1


def test_nested_break_in_an_inlined_autocast_block(capsys):
    ours, _ = run_both(calls_helper, torch.randn(4, 4))
    assert ours.count == 2


def cpu_amp(x):
    with torch.cpu.amp.autocast():
        y = x @ x
        probe("cpu.amp")
        z = y @ y
    return z


def test_cpu_amp_autocast(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # torch.compile (2.15) on CPython 3.13 fails inside Dynamo on torch.cpu.amp.autocast
        # (InternalTorchDynamoError: KeyError: dtype): then only eager is the reference
        ours, _ = run_both(cpu_amp, torch.randn(4, 4), torch_may_fail=True)
    assert ours.count == 2


# -- refused: the frame (or the break) falls back, with eager's values ------------------------

def manual_enter(x):
    ctx = torch.autocast("cpu")
    ctx.__enter__()
    y = x @ x
    probe("manual")
    ctx.__exit__(None, None, None)
    return y


def test_autocast_entered_by_hand_gives_eager_values(capsys):
    cf = ferrodyn.compile(manual_enter, backend=CountingBackend())
    for _ in range(2):
        SEEN.clear()
        want, seen = manual_enter(torch.eye(4)), list(SEEN)
        SEEN.clear()
        _same(cf(torch.eye(4)), want)
        assert SEEN == seen
        assert not torch.is_autocast_enabled("cpu")

"""make_fx(tracing_mode="symbolic") work that ferrodyn skips or memoises while keeping torch's
output: FakeTensorMode cache entries of the trace's ShapeEnv checked at their first use instead
of when made (proxy_dispatch/fake_cache.py), and the memory formats of symbolic tensors'
`tensor_meta` memoised per trace and ShapeEnv state (tracker.set_tensor_meta).

Each trace is compared with torch's make_fx on the same inputs (code, node names, every node's
meta, the ShapeEnv's guards and replacements: `assert_same_as_torch`). The programs repeat ops
so that entries are hit (views, tuple outputs, in-place ops, SymInt arguments), and change the
ShapeEnv between tensors of the same symbolic sizes (a guard, a replacement, unbacked sizes that
a later check decides), where a memo keyed on less than the ShapeEnv state would go stale.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx as torch_make_fx

from ferrodyn.proxy_dispatch import fake_cache, last_trace, make_fx
from test_make_fx_cache import assert_same_as_torch, shape_env_state


def views_twice(x):
    outs = []
    for _ in range(2):
        outs += [x.t() * 2, x.transpose(0, 1).contiguous(), x.unsqueeze(1).expand(-1, 3, -1) + 1,
                 x.reshape(-1) * 3, x.narrow(0, 1, 2) - 1, x.view(x.shape[1], -1) * 2]
    return outs


def tuple_outputs_twice(x):
    a = x.split(2)
    b = x.split(2)
    m1, i1 = x.max(dim=1)
    m2, i2 = x.max(dim=1)
    return a[0] * 2, b[1] + 1, m1 + m2, i1 + i2, x.unbind(0)[1] * x.unbind(0)[1]


def in_place_twice(x):
    y = x * 1
    y.add_(1)
    y.add_(1)
    z = y.t()
    z.mul_(2)
    z.mul_(2)
    return y, z


def symint_args_twice(x):
    n = x.shape[0]
    a = x.new_zeros(n, 3) + x.new_zeros(n, 3)
    b = x.repeat(n, 1) * 2
    c = x.repeat(n, 1) * 2
    return a, b + c, x.view(-1)[: n * 2] * x.view(-1)[: n * 2]


def hit_then_contiguous(x):
    # the second `x * 2` is a cache hit whose synthesised output computes its contiguity only
    # when asked: contiguous() then asks under tracing (torch names the next mul `mul_3`)
    a = x * 2
    b = x * 2
    return a.contiguous() + b.contiguous(), b.t().contiguous()


def guard_between_same_sizes(x):
    a = x.t() * 2
    torch._check(x.shape[0] == 4)  # a replacement between tensors of the same sizes
    b = x.t() * 2
    c = x.repeat(x.shape[1], 1)
    d = x.repeat(x.shape[1], 1)  # its memory-format checks guard the first time only
    return a, b, c, d


def unbacked_decided_later(x):
    idx = torch.nonzero(x > 0)  # (u0, 1): checks on u0 fall back without a guard
    a = idx.t() * 2
    b = idx.expand(-1, 3).t() * 2
    torch._check(idx.shape[0] == 1)  # now decided: the same sizes check differently
    c = idx.t() * 2
    d = idx.expand(-1, 3).t() * 2
    return a, b, c, d


PROGRAMS = {
    "views_twice": (views_twice, lambda: (torch.randn(4, 6),)),
    "tuple_outputs_twice": (tuple_outputs_twice, lambda: (torch.randn(4, 6),)),
    "in_place_twice": (in_place_twice, lambda: (torch.randn(4, 6),)),
    "symint_args_twice": (symint_args_twice, lambda: (torch.randn(3, 5),)),
    "hit_then_contiguous": (hit_then_contiguous, lambda: (torch.randn(4, 6),)),
    "guard_between_same_sizes": (guard_between_same_sizes, lambda: (torch.randn(4, 3),)),
    "unbacked_decided_later": (unbacked_decided_later, lambda: (torch.randn(5),)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_symbolic_trace_matches_torch(name):
    fn, make_args = PROGRAMS[name]
    hits = FakeTensorMode.cache_hits
    states = [shape_env_state(assert_same_as_torch(fn, make_args(), "symbolic"))
              for _ in range(2)]
    assert states[0] == states[1]
    if name != "unbacked_decided_later":
        assert FakeTensorMode.cache_hits > hits  # the programs do hit the ShapeEnv cache


def test_trace_installs_deferred_checks_on_its_own_fake_mode_only():
    x = torch.randn(4, 6)
    make_fx(views_twice, tracing_mode="symbolic")(x)
    assert fake_cache.installed(last_trace["tracker"].fake_mode)
    # a fake mode the caller made is used as it is
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    fx_ = mode.from_tensor(x)
    make_fx(views_twice, tracing_mode="symbolic")(fx_)
    assert last_trace["tracker"].fake_mode is mode and not fake_cache.installed(mode)


def _distinct_key_sets(monkeypatch):
    """Every dispatch key set compares unequal to every other: each cache entry check fails,
    torch's at the miss, ferrodyn's deferred one at the entry's first use."""
    def key_set(t):
        return object()

    monkeypatch.setattr(torch._C, "_dispatch_key_set", key_set)
    monkeypatch.setattr(fake_cache, "_key_set", key_set)


@pytest.mark.parametrize("name", ["hit_then_contiguous", "views_twice", "tuple_outputs_twice"])
def test_failed_deferred_check_runs_the_op_as_torch_does(name, monkeypatch):
    # a failed check makes the entry torch's bypass entry and runs the kernel: an output
    # synthesised from the entry instead would differ from torch's (hit_then_contiguous: the
    # kernel's mul output has its contiguity computed, a synthesised one does not)
    fn, make_args = PROGRAMS[name]
    _distinct_key_sets(monkeypatch)
    before = FakeTensorMode.cache_bypasses["dispatch_key_set mismatch"]
    ours = make_fx(fn, tracing_mode="symbolic")(*make_args())
    ours_bypasses = FakeTensorMode.cache_bypasses["dispatch_key_set mismatch"] - before
    ref = torch_make_fx(fn, tracing_mode="symbolic")(*make_args())
    assert ours.code == ref.code
    assert shape_env_state(ours) == shape_env_state(ref)
    assert ours_bypasses > 0
    # the failed entries are bypass entries now, as torch stores them
    env = ours.shape_env
    kinds = {type(e).__name__ for e in env.fake_tensor_cache.values()}
    assert "_DispatchCacheBypassEntry" in kinds


def test_data_dependent_synthesis_becomes_bypass(monkeypatch):
    # torch bypasses an entry whose synthesised output needs a data-dependent guard; the
    # deferred check does the same at the first use
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    calls = []

    def failing(self, state, entry, key, args):
        calls.append(key)
        raise GuardOnDataDependentSymNode(None, "test")

    monkeypatch.setattr(fake_cache, "_output_from_entry", failing)
    before = FakeTensorMode.cache_bypasses["data dependent symnode"]
    x = torch.randn(4, 6)
    ours = make_fx(hit_then_contiguous, tracing_mode="symbolic")(x)
    monkeypatch.undo()
    assert calls  # the one hit was checked
    assert FakeTensorMode.cache_bypasses["data dependent symnode"] > before
    # ran as the bypassed kernel: the result computes what eager computes
    for g, w in zip(ours(x), hit_then_contiguous(x)):
        torch.testing.assert_close(g, w)


def test_memo_key_changes_with_the_shape_env_state():
    from ferrodyn.proxy_dispatch.tracker import _symbolic_format_key

    seen = []

    def f(x):
        t = x.t()
        seen.append(_symbolic_format_key(x.fake_mode.shape_env, t.shape, t.stride(), t.numel()))
        torch._check(x.shape[1] == 3)
        seen.append(_symbolic_format_key(x.fake_mode.shape_env, t.shape, t.stride(), t.numel()))
        return t * 1

    make_fx(f, tracing_mode="symbolic")(torch.randn(4, 3))
    assert None not in seen and seen[0] != seen[1]
    assert seen[0][1:] == seen[1][1:]  # same sizes and strides: only the state differs

"""An entry calls its resume function through `_C.resume_call` (no frame of the resume
function on a hit): results, graph counts and hit counts as through the hook; a guard failure
of the resume function recompiles it, the cache limit makes it run eagerly, `reset()` and a
different backend recompile, exceptions propagate, recursion works, argument reference counts
are unchanged; ineligible functions are returned as they are."""

import sys
import types

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend
from ferrodyn import _C

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

SCALE = 2.0


def explicit_break(x, y):
    z = x * y + 1
    torch._dynamo.graph_break()
    return z.sin() + y


def tensor_if(x, y):
    z = x * y
    if z.sum() > 0:
        return z + 1
    return z - 1


def reads_global_after_break(x):
    y = x * 2
    torch._dynamo.graph_break()
    return y + SCALE


def raises_after_break(x, y):
    z = x + 1
    torch._dynamo.graph_break()
    return z + y  # shapes that do not broadcast raise here


def recursive(x, n):
    if n == 0:
        return x
    x = x * 2
    torch._dynamo.graph_break()
    return recursive(x, n - 1) + 1


def resume_codes(fn):
    """The resume functions the root entries of `fn` call (through the fastcall builtin)."""
    out = []
    for e in _C.cache_entries(fn.__code__):
        for name, v in e.fn.__globals__.items():
            if name.startswith("__ferrodyn_") and getattr(v, "__self__", None) is not None \
                    and type(v.__self__).__name__ == "_FastCallOwner":
                out.append(v)
    return out


def resume_function(fn):
    from ferrodyn.resume import emit
    return [f for f in emit._RESUME_FUNCTIONS.values()
            if f"_in_{fn.__name__}_at_" in f.__code__.co_name]


def offered():
    return _C._debug_hook_state()["offered"]


@pytest.mark.parametrize("fn", [explicit_break, tensor_if])
def test_results_graphs_and_hits_as_through_the_hook(fn):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    cf, ct = ferrodyn.compile(fn, backend=ours), torch.compile(fn, backend=theirs)
    for sign in (1, -1, 1, -1):
        x, y = torch.randn(4).abs() * sign, torch.randn(4).abs()
        torch.testing.assert_close(cf(x, y), fn(x, y))
        ct(x, y)
    assert ours.count <= theirs.count
    assert resume_codes(fn), "the entry calls its resume function through the builtin"
    # a hit runs the resume function's entry without offering its frame to the hook
    x, y = torch.randn(4).abs(), torch.randn(4).abs()
    cf(x, y)
    before = offered()
    fns = resume_function(fn)
    hits = {id(f): sum(e.hits for e in _C.cache_entries(f.__code__)) for f in fns}
    for _ in range(3):
        torch.testing.assert_close(cf(x, y), fn(x, y))
    assert offered() - before == 0  # root hits are looked up before their frame exists too
    after = {id(f): sum(e.hits for e in _C.cache_entries(f.__code__)) for f in fns}
    assert sum(after.values()) - sum(hits.values()) == 3


def test_resume_guard_failure_recompiles_through_the_fast_path():
    global SCALE
    backend = CountingBackend()
    cf = ferrodyn.compile(reads_global_after_break, backend=backend)
    x = torch.randn(3)
    try:
        SCALE = 2.0
        torch.testing.assert_close(cf(x), reads_global_after_break(x))
        cf(x)
        (k,) = resume_function(reads_global_after_break)
        assert len(_C.cache_entries(k.__code__)) == 1
        failures = _C.cache_stats()["guard_failures"]
        SCALE = 5.0
        torch.testing.assert_close(cf(x), reads_global_after_break(x))
        # the root entry still hit; the resume function's guard failed (counted once, by the
        # hook) and it was recompiled
        assert len(_C.cache_entries(reads_global_after_break.__code__)) == 1
        assert len(_C.cache_entries(k.__code__)) == 2
        assert _C.cache_stats()["guard_failures"] - failures == 1
        torch.testing.assert_close(cf(x), reads_global_after_break(x))
    finally:
        SCALE = 2.0


def test_resume_at_the_cache_limit_runs_eagerly():
    global SCALE
    old = _C.get_cache_size_limit()
    cf = ferrodyn.compile(reads_global_after_break, backend=CountingBackend())
    x = torch.randn(3)
    try:
        SCALE = 2.0
        cf(x)
        _C.set_cache_size_limit(1)
        SCALE = 7.0
        with pytest.warns(RuntimeWarning, match="cache size limit"):
            got = cf(x)
        torch.testing.assert_close(got, reads_global_after_break(x))
        (k,) = resume_function(reads_global_after_break)
        assert len(_C.cache_entries(k.__code__)) == 1
        torch.testing.assert_close(cf(x), reads_global_after_break(x))
    finally:
        SCALE = 2.0
        _C.set_cache_size_limit(old)


def test_reset_and_another_backend_recompile():
    x, y = torch.randn(4), torch.randn(4)
    a, b = CountingBackend(), CountingBackend()
    ca = ferrodyn.compile(explicit_break, backend=a)
    ca(x, y)
    ca(x, y)
    assert a.count == 2
    cb = ferrodyn.compile(explicit_break, backend=b)
    torch.testing.assert_close(cb(x, y), explicit_break(x, y))
    cb(x, y)
    assert b.count == 2 and a.count == 2  # b's frames run b's entries only
    ferrodyn.reset()
    torch.testing.assert_close(ca(x, y), explicit_break(x, y))
    assert a.count == 4


def test_exceptions_propagate():
    cf = ferrodyn.compile(raises_after_break, backend=CountingBackend())
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(cf(x, y), raises_after_break(x, y))
    cf(x, y)
    with pytest.raises(RuntimeError) as eager:
        raises_after_break(x, torch.randn(2))
    with pytest.raises(RuntimeError) as compiled:
        cf(x, torch.randn(2))
    assert str(compiled.value) == str(eager.value)
    torch.testing.assert_close(cf(x, y), raises_after_break(x, y))


def test_recursion():
    torch._dynamo.reset()
    cf = ferrodyn.compile(recursive, backend=CountingBackend())
    x = torch.randn(3)
    for n in (0, 1, 3, 3):
        torch.testing.assert_close(cf(x, n), recursive(x, n))


def test_argument_reference_counts_unchanged():
    cf = ferrodyn.compile(explicit_break, backend=CountingBackend())
    x, y = torch.randn(4), torch.randn(4)
    cf(x, y)
    cf(x, y)
    before = (sys.getrefcount(x), sys.getrefcount(y))
    for _ in range(50):
        cf(x, y)
    assert (sys.getrefcount(x), sys.getrefcount(y)) == before


def test_run_only_mode_and_hook_off():
    x, y = torch.randn(4), torch.randn(4)
    cf = ferrodyn.compile(explicit_break, backend=CountingBackend())
    cf(x, y)
    (k,) = resume_function(explicit_break)
    fast = _C.resume_call(k)
    z = x * y + 1
    hits = _C.cache_entries(k.__code__)[0].hits
    # hook off (no compiled call around it): the resume function runs as written
    torch.testing.assert_close(fast(x, y, z, None), z.sin() + y)
    assert _C.cache_entries(k.__code__)[0].hits == hits
    # run-only mode: the cached entry runs
    run_only = _C.CompiledFunction(lambda: fast(x, y, z, None), False)
    torch.testing.assert_close(run_only(), z.sin() + y)
    assert _C.cache_entries(k.__code__)[0].hits == hits + 1
    # a wrong number of arguments is the function's own TypeError
    with pytest.raises(TypeError):
        run_only_bad = _C.CompiledFunction(lambda: fast(x, y), False)
        run_only_bad()
    with pytest.raises(TypeError):
        fast(x, y, z, None, w=1)


def test_ineligible_functions_are_returned_unchanged():
    def gen(x):
        yield x

    def varargs(*a):
        return a

    def kwonly(x, *, y):
        return x

    cell = 1

    def closure(x):
        return x + cell

    for f in (gen, varargs, kwonly, closure, print, len):
        assert _C.resume_call(f) is f
    plain = types.FunctionType(explicit_break.__code__, explicit_break.__globals__)
    assert _C.resume_call(plain) is not plain


# --- CompiledFunction is called by vectorcall ---------------------------------------------

def kw_fn(a, b=2, *rest, c=3, **kw):
    return (a, b, rest, c, sorted(kw.items()))


def test_compiled_function_vectorcall_passes_every_argument_form():
    cf = _C.CompiledFunction(kw_fn, False)
    assert cf(1) == kw_fn(1)
    assert cf(1, 5, 6, 7, c=8, d=9) == kw_fn(1, 5, 6, 7, c=8, d=9)
    assert cf(*[1, 2], **{"c": 0, "z": 1}) == kw_fn(1, 2, c=0, z=1)
    # the class's __call__ (tp_call) still works and agrees
    assert type(cf).__call__(cf, 1, 5, c=8) == kw_fn(1, 5, c=8)
    # bound as a method: CPython prepends self in the argument array
    class Holder:
        m = _C.CompiledFunction(kw_fn, False)
    h = Holder()
    assert h.m(5, c=1) == kw_fn(h, 5, c=1)
    with pytest.raises(TypeError):
        cf()


def test_compiled_function_vectorcall_restores_callback_and_reference_counts():
    def cb(frame):
        return None

    marker = object()
    seen = []

    def body(x):
        seen.append(_C.get_eval_frame())
        if x is marker:
            raise KeyError("raised")
        return x

    cf = _C.CompiledFunction(body, cb)
    prior = _C.get_eval_frame()
    before = (sys.getrefcount(cb), sys.getrefcount(marker))
    for _ in range(100):
        assert cf(1) == 1
        with pytest.raises(KeyError):
            cf(marker)
    assert _C.get_eval_frame() is prior
    assert all(s is cb for s in seen)
    seen.clear()
    assert (sys.getrefcount(cb), sys.getrefcount(marker)) == before


class KwModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x, y=None, *, scale=1.0):
        out = x * self.w * scale
        return out if y is None else out + y


def test_module_call_vectorcall_argument_forms_and_hooked_path():
    mod = KwModule()
    opt = ferrodyn.compile(mod, backend=CountingBackend())
    x, y = torch.randn(3), torch.randn(3)
    with torch.no_grad():
        for args, kwargs in (((x,), {}), ((x, y), {}), ((x,), {"y": y, "scale": 2.0}),
                             ((x,), {"scale": 3.0})):
            torch.testing.assert_close(opt(*args, **kwargs), mod(*args, **kwargs))
        # a hook on the wrapper: nn.Module.__call__(wrapper, *args, **kwargs) runs it
        seen = []
        h = opt.register_forward_pre_hook(lambda m, a, kw: seen.append((len(a), sorted(kw))),
                                          with_kwargs=True)
        try:
            torch.testing.assert_close(opt(x, y=y, scale=2.0), mod(x, y=y, scale=2.0))
            torch.testing.assert_close(opt(x, y), mod(x, y))
        finally:
            h.remove()
        assert seen == [(1, ["scale", "y"]), (2, [])]
        torch.testing.assert_close(opt(x, scale=0.5), mod(x, scale=0.5))

"""A missing key of a plain dict raises a KeyError that the traced code may catch (as CPython):
`try: d[k] except KeyError`, `dict.pop`/`del` of a missing key, `Mapping.get` over a mapping
whose `__getitem__` raises (`os.environ.get`, transformers' use_gqa_in_sdpa). The key's absence
is guarded: adding the key (or setting the environment variable) recompiles, with eager's value.
Each case: compiled == eager, state included, with graph counts against torch.compile's."""

import os

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")
ENV = "FERRODYN_TEST_TRACED_KEY_ERROR"


def lookup(x, d):
    try:
        v = d["k"]
    except KeyError:
        v = d["a"] * -1
    return x + v


def pop_missing(x, d):
    try:
        d.pop("k")
        hit = 1
    except KeyError as e:
        hit = len(e.args)
    return x * hit


def delete_missing(x, d):
    try:
        del d["k"]
    except KeyError:
        return x - 1
    return x + 1


def environ_get(x, d):
    return x * 2 if os.environ.get(ENV) else x


def _run(fn, dicts, monkeypatch, env_values):
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CountingBackend()
    compiled = ferrodyn.compile(fn, backend=ours)
    by_torch = torch.compile(fn, backend=theirs)
    x = torch.arange(3.0)
    for d, env in zip(dicts, env_values):
        if env is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, env)
        mine, eager_d, torch_d = dict(d), dict(d), dict(d)
        want = fn(x, eager_d)
        torch.testing.assert_close(compiled(x, mine), want)
        by_torch(x, torch_d)
        assert mine.keys() == eager_d.keys()
    return ours, theirs


@pytest.mark.parametrize("fn", [lookup, pop_missing, delete_missing], ids=lambda f: f.__name__)
def test_caught_key_error_of_a_dict(fn, monkeypatch):
    a, b, k = torch.ones(3), torch.full((3,), 2.0), torch.full((3,), 5.0)
    dicts = [{"a": a}, {"a": b}, {"a": a, "k": k}]  # the key appears on the third call
    ours, theirs = _run(fn, dicts, monkeypatch, [None] * 3)
    # one graph per key set; torch.compile captures no more of this code than ferrodyn
    assert ours.count == 2 and ours.count >= theirs.count


def test_os_environ_get_is_captured_and_guarded(monkeypatch):
    from ferrodyn import _C
    ours, theirs = _run(environ_get, [{}] * 4, monkeypatch, [None, None, "1", "1"])
    # the first entry returns x (no graph op, no backend call); setting the variable fails its
    # guard on the environment's keys and compiles `x * 2`
    assert len(_C.cache_entries(environ_get.__code__)) == 2
    assert ours.count == 1 and ours.count >= theirs.count  # torch.compile: no more captured


def test_uncaught_key_error_runs_eagerly_and_raises():
    compiled = ferrodyn.compile(lambda d: d["k"] + 1, backend="eager")
    with pytest.raises(KeyError):
        compiled({"a": 1})

"""The object model that library code leans on (found on transformers' BERT training step, one
test per class of construct): objects that keep their attributes in `__slots__` members only
(`dataclasses.Field`, `@dataclass(slots=True)`), dicts keyed by objects that hash by identity
(classes, `typing.Union`), attribute stores on an object whose `__dict__` the trace already read
as a dict, and torch.nn's stateless modules created inside the traced code. Compiled == eager
(results and mutated state), graph counts against torch.compile's in the same test, and the
guards that make a changed value recompile."""

import contextlib
import dataclasses
import functools
import typing

import pytest
import torch
import torch._dynamo

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _run_both(fn, make_args, state=lambda args: None, calls=1):
    """Run `fn` eagerly, through ferrodyn.compile and through torch.compile, each on fresh
    arguments from `make_args()`, `calls` times; results and `state(args)` must agree with
    eager's. Returns (ferrodyn graphs, torch.compile graphs)."""
    ours, theirs = CountingBackend(), CountingBackend()
    torch._dynamo.reset()
    runs = {"eager": fn, "ferrodyn": ferrodyn.compile(fn, backend=ours),
            "torch": torch.compile(fn, backend=theirs)}
    outs = {}
    for name, f in runs.items():
        torch.manual_seed(0)
        args = make_args()
        torch.manual_seed(1)
        results = [f(*args) for _ in range(calls)]
        outs[name] = (results, state(args))
    torch._dynamo.reset()
    for name in ("ferrodyn", "torch"):
        got, want = outs[name], outs["eager"]
        _assert_same(got[0], want[0], name)
        assert got[1] == want[1], f"{name}: state {got[1]!r} != {want[1]!r}"
    return ours.count, theirs.count


def _assert_same(got, want, name):
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), f"{name}: {got!r} != {want!r}"
        for g, w in zip(got, want):
            _assert_same(g, w, name)
    else:
        assert got == want, f"{name}: {got!r} != {want!r}"


# -- __slots__ members read through their descriptors ----------------------------------------

@dataclasses.dataclass(slots=True)
class Slotted:
    scale: float
    name: str


class Point:
    __slots__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y


@dataclasses.dataclass
class Cfg:
    hidden: int = 4
    act: str = "relu"


def field_names(x, cfg):
    names = [f.name for f in dataclasses.fields(cfg)]
    return x * len(names), names


def slots_read(x, s, p):
    return x * s.scale + p.x - p.y, s.name


def test_dataclass_fields_names_are_read_from_field_slots():
    ours, theirs = _run_both(field_names, lambda: (torch.randn(3), Cfg()))
    assert ours == theirs == 1


def test_slots_members_read_and_guarded():
    ours, theirs = _run_both(slots_read, lambda: (torch.randn(3), Slotted(2.0, "a"), Point(1, 5)))
    assert ours == theirs == 1
    cnt = CountingBackend()
    f = ferrodyn.compile(slots_read, backend=cnt)
    x, s, p = torch.randn(3), Slotted(2.0, "a"), Point(1, 5)
    f(x, s, p)
    p.y = 7.0  # the member's value is guarded: a changed slot recompiles
    out, name = f(x, s, p)
    torch.testing.assert_close(out, x * 2.0 + 1 - 7.0)
    assert name == "a" and cnt.count == 2


def slot_probe(x, p):
    return x + 1 if hasattr(p, "y") else x - 1


def test_hasattr_of_an_unset_slot_is_false():
    def make():
        p = Point(1, 2)
        del p.y
        return torch.randn(3), p
    ours, theirs = _run_both(slot_probe, make)
    assert theirs == 1 and ours <= 1  # eager answers False; never a wrong branch
    ours, theirs = _run_both(slot_probe, lambda: (torch.randn(3), Point(1, 2)))
    assert ours == theirs == 1


def slot_store(x, p):
    p.x = 10  # a member descriptor's store: refused (the frame runs eagerly), never lost
    return x + p.x


def test_slot_store_reaches_the_object():
    _run_both(slot_store, lambda: (torch.randn(3), Point(1, 2)), state=lambda a: (a[1].x, a[1].y))


# -- dicts keyed by objects that hash by identity ----------------------------------------------

def _union(value, args):
    return len(args)


def _seq(value, args):
    return 100 + len(args)


VALIDATORS = {typing.Union: _union, list: _seq, tuple: _seq}


def validate(x, tp):
    validator = VALIDATORS.get(typing.get_origin(tp))
    return x * validator(x, typing.get_args(tp)) if validator is not None else x - 1


@pytest.mark.parametrize("tp", [typing.Optional[int], typing.Union[int, str, None], list[int],
                                int], ids=str)
def test_dict_keyed_by_classes_and_special_forms(tp):
    ours, theirs = _run_both(validate, lambda: (torch.randn(3), tp))
    assert ours <= theirs == 1


class Token:
    pass


A, B = Token(), Token()
BY_TOKEN = {A: 2.0, B: 3.0}


def by_token(x, tok):
    return x * BY_TOKEN[tok]


def test_identity_keyed_lookup_is_guarded_by_identity():
    cnt = CountingBackend()
    f = ferrodyn.compile(by_token, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(f(x, A), x * 2.0)
    torch.testing.assert_close(f(x, B), x * 3.0)  # same type, other object: recompiles
    assert cnt.count == 2


# -- a store after the trace read the object's __dict__ as a dict -------------------------------

class DictPeeking:
    """Reads its own `__dict__` on every attribute access (transformers' config mixins)."""

    def __init__(self):
        self.problem = None
        self.labels = 3

    def __getattribute__(self, key):
        spec = super().__getattribute__("__dict__").get("_spec")
        if spec is not None:
            raise AttributeError(key)
        return super().__getattribute__(key)


def set_problem(x, cfg):
    if cfg.problem is None:
        cfg.problem = "single" if cfg.labels > 1 else "regression"
    return x * cfg.labels if cfg.problem == "single" else x


def test_store_after_dict_view_goes_through_the_dict():
    ours, theirs = _run_both(set_problem, lambda: (torch.randn(3), DictPeeking()),
                             state=lambda a: dict(object.__getattribute__(a[1], "__dict__")),
                             calls=2)
    assert ours == theirs == 2  # the first call sets the guarded attribute


# -- torch.nn's stateless modules created in the traced code ------------------------------------

def loss_in_frame(logits, labels):
    loss_fct = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    return loss_fct(logits.view(-1, 3), labels.view(-1))


def test_stateless_module_created_in_frame():
    ours, theirs = _run_both(loss_in_frame,
                             lambda: (torch.randn(4, 3), torch.tensor([0, 2, 1, 1])))
    assert ours == theirs == 1


def module_with_params(x):
    return torch.nn.Linear(3, 2)(x)


def test_module_with_parameters_is_not_built_at_trace_time():
    # built at run time as eager builds it (a graph break): the same RNG draws, the same result
    ours, theirs = _run_both(module_with_params, lambda: (torch.randn(4, 3),))
    assert ours == theirs == 1


def module_escapes(x):
    act = torch.nn.ReLU()
    return act(x), act


def test_created_module_escaping_the_frame_is_a_fresh_object():
    f = ferrodyn.compile(module_escapes, backend=CountingBackend())
    x = torch.randn(3)
    (y1, m1), (y2, m2) = f(x), f(x)
    torch.testing.assert_close(y1, x.relu())
    assert isinstance(m1, torch.nn.ReLU) and m1 is not m2


# -- functools.lru_cache / functools.cache wrappers --------------------------------------------

def _counted_cache():
    body_runs = []

    @functools.lru_cache(maxsize=None)
    def heads(n, scale=1):
        body_runs.append(n)
        return n * 2 * scale

    return heads, body_runs


def test_lru_cache_on_constants_runs_the_body_as_eager_does():
    runs = {}
    for name in ("eager", "ferrodyn"):
        heads, body_runs = _counted_cache()

        def fn(x):
            return x * heads(3) + heads(3, scale=2)

        f = fn if name == "eager" else ferrodyn.compile(fn, backend=CountingBackend())
        x = torch.randn(3)
        for _ in range(3):
            torch.testing.assert_close(f(x), x * 6 + 12)
        runs[name] = (list(body_runs), heads.cache_info().misses)
    assert runs["ferrodyn"] == runs["eager"] == ([3, 3], 2)
    heads, _ = _counted_cache()
    ours, theirs = _run_both(lambda x: x * heads(4), lambda: (torch.randn(3),))
    assert ours == theirs == 1


@functools.cache
def shared_table(n):
    return [n]


def returns_cached_list(x):
    return x + 1, shared_table(5)


def test_lru_cache_mutable_result_is_the_cached_object():
    f = ferrodyn.compile(returns_cached_list, backend=CountingBackend())
    for _ in range(2):
        _, table = f(torch.randn(2))
        assert table is shared_table(5)  # identity, as eager: never a copy


@functools.lru_cache(maxsize=8)
def doubled(t):
    return t * 2


def cached_on_tensor(x):
    return doubled(x) + 1


def test_lru_cache_tensor_argument_hits_the_cache_as_eager():
    # a hit returns the result cached for this very tensor, stale after an in-place change
    f = ferrodyn.compile(cached_on_tensor, backend=CountingBackend())
    x, y = torch.ones(3), torch.ones(3)
    first = f(x)
    x.add_(10)  # eager's cache still holds the result for the unmutated x
    torch.testing.assert_close(f(x), first)
    torch.testing.assert_close(cached_on_tensor(y), f(y))


class Scaler:
    def __init__(self, k):
        self.k = k

    @functools.lru_cache
    def factor(self, n):
        return self.k * n


S3 = Scaler(3)


def cached_method(x):
    return x * S3.factor(2)


def test_lru_cache_method_binds_self_and_guards_it():
    ours, theirs = _run_both(cached_method, lambda: (torch.randn(3),))
    assert ours == theirs == 1


PENDING = []


def cached_after_mutation(x):
    PENDING.append(1)
    return x * _pending_len(0)


@functools.lru_cache
def _pending_len(_):
    return len(PENDING)  # reads state the frame has just mutated


def test_lru_cache_call_waits_for_pending_mutations():
    f = ferrodyn.compile(cached_after_mutation, backend=CountingBackend())
    PENDING.clear()
    _pending_len.cache_clear()
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 1)  # eager: the body sees the appended item
    assert PENDING == [1]


# -- contextlib.ExitStack ------------------------------------------------------------------------

class Logged:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __enter__(self):
        self.log.append(f"enter {self.name}")
        return self.name

    def __exit__(self, *exc):
        self.log.append(f"exit {self.name}")
        return False


@contextlib.contextmanager
def gen_cm(log):
    log.append("gen enter")
    yield 7
    log.append("gen exit")


def exit_stack_mix(x, log):
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(Logged(log, "a"))
        stack.enter_context(torch.no_grad())
        k = stack.enter_context(gen_cm(log))
        stack.callback(log.append, "callback")
        y = x * k
        log.append(f"body {a} {y.requires_grad}")
    log.append("after")
    return y, y.requires_grad, x * 2


def test_exit_stack_runs_exits_innermost_first():
    ours, theirs = _run_both(exit_stack_mix, lambda: (torch.randn(3, requires_grad=True), []),
                             state=lambda a: list(a[1]))
    assert ours == 1 >= theirs  # torch.compile (pinned) runs this frame eagerly


def exit_stack_pop_all(x, log):
    with contextlib.ExitStack() as outer:
        outer.enter_context(Logged(log, "a"))
        outer.callback(log.append, "cb")
        moved = outer.pop_all()  # the outer stack is now empty: nothing runs at its exit
        log.append("body")
    log.append("closing")
    moved.close()
    return x + 1


def test_exit_stack_pop_all_and_close():
    ours, theirs = _run_both(exit_stack_pop_all, lambda: (torch.randn(3), []),
                             state=lambda a: list(a[1]))
    assert ours == theirs == 1


def _raise_value_error():
    raise ValueError("from a callback")


def exit_stack_raising_callback(x, log):
    with contextlib.ExitStack() as stack:
        stack.callback(log.append, "second")
        stack.callback(_raise_value_error)
        log.append("body")
    return x + 1


def test_exit_stack_exception_path_is_eager():
    log_e, log_c = [], []
    with pytest.raises(ValueError, match="from a callback"):
        exit_stack_raising_callback(torch.randn(3), log_e)
    f = ferrodyn.compile(exit_stack_raising_callback, backend=CountingBackend())
    with pytest.raises(ValueError, match="from a callback"):
        f(torch.randn(3), log_c)
    assert log_c == log_e == ["body", "second"]


def exit_stack_escapes(x, log):
    stack = contextlib.ExitStack()
    stack.enter_context(Logged(log, "a"))
    return x + 1, stack


def test_exit_stack_escaping_keeps_its_exits():
    log = []
    f = ferrodyn.compile(exit_stack_escapes, backend=CountingBackend())
    _, stack = f(torch.randn(3), log)
    stack.close()
    assert log == ["enter a", "exit a"]

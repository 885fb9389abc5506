"""`contextlib.contextmanager` contexts that receive an exception (from the `with` body or a
direct `__exit__(typ, value, tb)` call), compiled vs eager: the exception is thrown into the
generator at its `yield` as CPython's contextlib does, so the generator's `except`/`finally`
run once, a handler that ends swallows it, one that re-raises or raises another replaces it
(with its chaining), and the RuntimeErrors of a generator that does not yield / does not stop.
Results, side-effect lists, raised type/message and graph counts are compared with eager and
torch.compile."""

import contextlib

import pytest
import torch

import ferrodyn
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _x():
    return torch.randn(4, generator=torch.Generator().manual_seed(0))


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert got == want, (got, want)


def run_both(make):
    """`make()` -> (fn, log): a fresh function and the list its context managers append to.
    Runs it eagerly, under ferrodyn (twice: the second call hits the cache) and under
    torch.compile; ferrodyn's results (or raised type and message) and logs must match eager's.
    Returns the graph counts (ferrodyn, torch)."""
    def outcome(f, log):
        try:
            r = ("ok", f(_x()))
        except Exception as e:  # noqa: BLE001
            r = ("raised", type(e), str(e))
        return r, list(log)

    fn, log = make()
    want = outcome(fn, log)
    ours, theirs = CountingBackend(), CountingBackend()
    fn, log = make()
    cf = ferrodyn.compile(fn, backend=ours)
    for _ in range(2):
        log.clear()
        _same(outcome(cf, log), want)
    torch._dynamo.reset()
    fn, log = make()
    outcome(torch.compile(fn, backend=theirs), log)  # counted only: torch chains some of
    torch._dynamo.reset()                            # these RuntimeErrors differently
    return ours.count, theirs.count


def test_finally_runs_once_and_exception_propagates():
    def make():
        log = []

        @contextlib.contextmanager
        def cm():
            log.append("enter")
            try:
                yield 42
            finally:
                log.append("finally")

        def fn(t):
            try:
                with cm() as v:
                    t = t * v
                    raise KeyError("k")
            except KeyError as e:
                log.append(e.args)
                t = t + 1
            return t
        return fn, log

    assert run_both(make) == (1, 1)


def test_generator_handler_swallows():
    def make():
        log = []

        @contextlib.contextmanager
        def cm():
            try:
                yield
            except ZeroDivisionError as e:
                log.append(("caught", e.args))

        def fn(t):
            with cm():
                t = t * 2
                raise ZeroDivisionError(999)
            return t + 1
        return fn, log

    assert run_both(make) == (1, 1)


def test_generator_reraises_and_unmatched_handler():
    def make():
        log = []

        @contextlib.contextmanager
        def cm():
            try:
                yield
            except KeyError:
                log.append("key")
                raise
            except IndexError:
                log.append("index")

        def fn(t):
            try:
                with cm():
                    raise KeyError("a")
            except KeyError as e:
                t = t + len(e.args)
            try:
                with cm():
                    raise ValueError("b")
            except ValueError as e:
                t = t * 3
                log.append(e.args)
            return t
        return fn, log

    assert run_both(make) == (1, 1)


def test_generator_raises_another_exception_chained():
    def make():
        log = []

        @contextlib.contextmanager
        def cm():
            try:
                yield
            except BaseException:
                raise ValueError("replaced")  # noqa: B904

        @contextlib.contextmanager
        def wrap():
            try:
                yield
            except Exception as exc:
                raise RuntimeError("wrapped") from exc

        def fn(t):
            try:
                with cm():
                    raise IndexError("orig")
            except ValueError as e:
                log.append((str(e), type(e.__context__).__name__, e.__context__.args))
            except IndexError:
                log.append("wrong")
            try:
                with wrap():
                    raise ZeroDivisionError
            except RuntimeError as e:
                log.append((type(e.__cause__).__name__, e.__suppress_context__))
            try:
                with wrap():
                    raise StopIteration("unchained")
            except Exception as e:
                log.append((type(e).__name__, e.args, e.__cause__ is None))
            return t.sin()
        return fn, log

    assert run_both(make) == (1, 1)


def test_exception_escaping_the_frame_after_generator_cleanup():
    def make():
        log = []

        @contextlib.contextmanager
        def cm():
            try:
                yield
            finally:
                log.append("cleanup")

        def fn(t):
            with cm():
                raise KeyError("out")
        return fn, log

    ours, theirs = run_both(make)
    assert ours == theirs == 0


def test_direct_exit_calls_and_runtime_errors():
    def make():
        log = []

        @contextlib.contextmanager
        def plain():
            yield

        @contextlib.contextmanager
        def yields_after_throw():
            try:
                yield
            except Exception:
                log.append("handler")
                yield

        @contextlib.contextmanager
        def yields_twice():
            try:
                yield
                yield
            finally:
                log.append("closed")

        @contextlib.contextmanager
        def never_yields():
            if False:
                yield

        def fn(t):
            ctx = plain()
            ctx.__enter__()
            log.append(ctx.__exit__(TypeError, TypeError("foo"), None))
            for make_ctx, exc in ((yields_after_throw, TypeError), (yields_twice, None)):
                ctx = make_ctx()
                ctx.__enter__()
                try:
                    ctx.__exit__(exc, None, None)
                except RuntimeError as e:
                    log.append(str(e))
            try:
                never_yields().__enter__()
            except RuntimeError as e:
                log.append((str(e), e.__suppress_context__, type(e.__context__).__name__))
            return t.sum()
        return fn, log

    assert run_both(make) == (1, 1)


def test_grad_mode_restored_by_generator_finally():
    def make():
        log = []

        @contextlib.contextmanager
        def no_grad_cm():
            prev = torch.is_grad_enabled()
            torch._C._set_grad_enabled(False)
            try:
                yield
            finally:
                torch._C._set_grad_enabled(prev)

        def fn(t):
            t = t.requires_grad_()
            try:
                with no_grad_cm():
                    y = t * 2
                    raise ValueError
            except ValueError:
                log.append(torch.is_grad_enabled())
            return y, y.requires_grad, (t * 3).requires_grad
        return fn, log

    assert run_both(make) == (1, 1)
    assert torch.is_grad_enabled()


class _Suppress:
    def __init__(self, log, cls):
        self.log, self.cls = log, cls

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        self.log.append(("exit", et))
        return et is not None and issubclass(et, self.cls)


def test_exit_stack_receives_the_exception():
    """ExitStack.__exit__ with an exception: exits run innermost first with it, one that
    returns true suppresses it for the ones after it, callbacks run either way; suppressed
    or propagated as eager."""
    def make():
        log = []

        @contextlib.contextmanager
        def gen():
            try:
                yield
            except KeyError:
                log.append("gen saw KeyError")
                raise

        def fn(t):
            try:
                with contextlib.ExitStack() as stack:
                    stack.callback(log.append, "callback")
                    stack.enter_context(_Suppress(log, IndexError))
                    stack.enter_context(gen())
                    t = t * 2
                    raise KeyError("k")
            except KeyError as e:
                log.append(e.args)
            with contextlib.ExitStack() as stack:
                stack.enter_context(_Suppress(log, IndexError))
                stack.enter_context(_Suppress(log, ValueError))
                stack.callback(log.append, "cb2")
                t = t + 1
                raise ValueError("swallowed")
            return t
        return fn, log

    assert run_both(make) == (1, 1)


def test_generator_wraps_the_exception_in_an_f_string_message():
    """`raise RuntimeError(f"caught {exc}") from exc` in the generator: the f-string formats
    the builtin exception (str and repr) as eager does."""
    def make():
        log = []

        @contextlib.contextmanager
        def woohoo():
            try:
                yield
            except Exception as exc:
                raise RuntimeError(f"caught {exc} / {exc!r}") from exc

        def fn(t):
            try:
                with woohoo():
                    1 / 0
            except RuntimeError as e:
                log.append((str(e), type(e.__cause__).__name__))
            try:
                with woohoo():
                    raise KeyError("k", 2)
            except RuntimeError as e:
                log.append(e.args)
            return t.sin()
        return fn, log

    assert run_both(make) == (1, 1)

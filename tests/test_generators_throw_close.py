"""Generators driven by `throw()` and `close()` in traced code, and the exceptions of their
protocol: the exception is raised at the suspended `yield` and the body's own handlers run
(`except`, `finally`, GeneratorExit caught or re-raised, a return from the handler), the
consumer sees what CPython gives it (the next yielded value, StopIteration with the return
value, the propagated exception, PEP 479's RuntimeError with its cause). Compared with eager
(values, logs of what ran, exception types) and with torch.compile's graph count. What is not
modelled (throw() through `yield from`, a body that yields in close(), throw() into a
generator that has not started) runs eagerly with eager's result. Cases after PyTorch's
test/dynamo/test_generator.py, written afresh."""

import pytest
import torch

import ferrodyn
from compiled_vs_eager import check_one_graph_like_torch, run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _x():
    return torch.arange(3.0)


def close_runs_finally(x):
    log = []

    def body():
        try:
            log.append("start")
            yield x + 1
            log.append("never")
            yield x + 2
        finally:
            log.append("finally")
    g = body()
    first = next(g)
    log.append("before close")
    r = g.close()
    log.append("after close")
    return first, r, log


def close_caught_and_returns(x):
    log = []

    def body():
        try:
            yield x.sin()
            yield x.cos()
        except GeneratorExit:
            log.append("exit")
            return x.tan()  # close() returns it on 3.13+, None before
        finally:
            log.append("finally")
    g = body()
    first = next(g)
    return first, g.close(), log


def close_not_caught_by_except_exception(x):
    log = []

    def body():
        try:
            yield
        except Exception:
            log.append("except")
        finally:
            log.append("finally")
    g = body()
    next(g)
    g.close()
    return x + 1, log


def close_reraises_generator_exit(x):
    log = []

    def body():
        try:
            yield x + 1
        except GeneratorExit:
            log.append("exit")
            raise
        finally:
            log.append("finally")
    g = body()
    first = next(g)
    g.close()
    return first, log


def close_twice_and_before_start(x):
    log = []

    def body():
        try:
            yield x + 1
            yield x + 2
        finally:
            log.append("finally")
    body().close()  # never started: nothing runs
    g = body()
    first = next(g)
    return first, g.close(), g.close(), log


def close_after_body_raised(x):
    def body():
        raise ValueError("foo")
        yield x
    g = body()
    try:
        next(g)
    except ValueError as e:
        why = e.args
    return x + 1, why, g.close()


def next_after_close(x):
    def body():
        yield x + 1
    g = body()
    g.close()
    try:
        next(g)
    except StopIteration as e:
        return x - 1, e.args
    return x


def throw_caught_yields_next(x):
    log = []

    def body():
        try:
            log.append(1)
            yield x.sin()
        except RuntimeError as e:
            log.append(("caught", e.args))
            yield x.cos()
        finally:
            log.append("finally")
    g = body()
    a = next(g)
    b = g.throw(RuntimeError("boom"))
    rest = list(g)  # runs the finally (left suspended, CPython would run it at collection)
    return a + b, rest, log


def throw_class_try_except_finally(x):
    z = [0]

    def body():
        try:
            z[0] += 1
            yield x.sin()
        except ValueError:
            yield x.cos()
        except RuntimeError:
            z[0] += 100
            yield x.tan()
        finally:
            z[0] += 1000
        z[0] += 10_000
    g = body()
    a = next(g)
    b = g.throw(RuntimeError)
    rest = list(g)
    return a + b, rest, z


def throw_body_returns(x):
    z = []

    def body():
        try:
            yield 1
        except ValueError:
            z.append("except")
            return 7
        finally:
            z.append("finally")
    g = body()
    next(g)
    try:
        g.throw(ValueError)
    except StopIteration as e:
        return x + e.value, e.args, z
    return x, z


def throw_not_caught_propagates(x):
    z = []

    def body():
        try:
            yield x.sin()
        except ValueError:
            yield x.cos()
        finally:
            z.append("finally")
    g = body()
    a = next(g)
    try:
        g.throw(KeyError("k"))
    except KeyError as e:
        return a + 1, e.args, z, next(g, "exhausted")
    return a, z


def throw_caught_in_loop(x):
    caught = []

    def body():
        while True:
            try:
                yield
            except ValueError as v:
                caught.append(str(v))
    g = body()
    next(g)
    g.throw(ValueError)
    g.throw(ValueError("xyz"))
    try:
        g.throw(TypeError)
    except TypeError:
        caught.append("type")
    try:
        g.send(2)
    except StopIteration:
        caught.append("stopped")
    return x + 1, caught


def throw_context_is_handled_exception(x):
    def body():
        try:
            yield 1
        except KeyError as e:
            yield type(e.__context__).__name__

    g = body()
    next(g)
    try:
        raise IndexError
    except IndexError:
        name = g.throw(KeyError)
    return x + 1, name, list(g)


def send_non_none_to_new_generator(x):
    def body():
        yield 1
    try:
        body().send("foo")
    except TypeError as e:
        return x + 1, str(e)
    return x


def pep479_raise_in_body(x):
    def body():
        yield x + 1
        raise StopIteration("boom")
    g = body()
    next(g)
    try:
        next(g)
    except RuntimeError as e:
        return x + 1, str(e), type(e.__cause__).__name__, e.__cause__.args
    return x


def pep479_inner_next(x):
    def inner():
        yield x + 1

    def body():
        it = inner()
        while True:
            yield next(it)
    g = body()
    next(g)
    try:
        next(g)
    except RuntimeError as e:
        return x + 1, str(e)
    return x


def error_propagates_then_stops(x):
    def f():
        return 1 // 0

    def body():
        yield f()
        yield 42
    g = body()
    r = []
    try:
        next(g)
    except ZeroDivisionError as e:
        r.append(str(e))
    try:
        next(g)
    except StopIteration:
        r.append("stop")
    return x + 1, r


def pep_try_except_finally(x):
    def f():
        try:
            yield 1
            try:
                yield 2
                1 // 0
                yield 3
            except ZeroDivisionError:
                yield 4
                yield 5
                raise
            except:  # noqa: E722
                yield 6
            yield 7
        except:  # noqa: E722
            yield 8
        yield 9
        try:
            pass
        finally:
            yield 10
        yield 11
    return x + 1, list(f())


def send_to_subscript_targets(x):
    def f(d):
        d[(yield "a")] = d[(yield "b")] = 27
    data = [1, 2]
    g = f(data)
    r = [g.send(None), list(data), g.send(0), list(data)]
    try:
        g.send(1)
    except StopIteration:
        r.append("stop")
    return x + 1, r, data


def close_context_is_consumers_exception(x):
    seen = []

    def body():
        try:
            yield 1
        except GeneratorExit as e:
            seen.append(type(e.__context__).__name__)

    def own():
        try:
            raise TypeError
        except TypeError:
            try:
                yield 1
            except KeyError as e:
                yield type(e.__context__).__name__

    g = body()
    next(g)
    h = own()
    next(h)
    try:
        raise IndexError
    except IndexError:
        g.close()
        seen.append(h.throw(KeyError))  # the body's own handled exception, not IndexError
    seen.extend(h)
    return x + 1, seen


@pytest.mark.parametrize("fn", [
    close_runs_finally, close_caught_and_returns, close_not_caught_by_except_exception,
    close_reraises_generator_exit, close_twice_and_before_start, close_after_body_raised,
    next_after_close, throw_caught_yields_next, throw_class_try_except_finally,
    throw_body_returns, throw_not_caught_propagates, throw_caught_in_loop,
    throw_context_is_handled_exception, send_non_none_to_new_generator, pep479_raise_in_body,
    pep479_inner_next, error_propagates_then_stops, pep_try_except_finally,
    send_to_subscript_targets,
], ids=lambda f: f.__name__)
def test_one_graph_like_eager(fn):
    check_one_graph_like_torch(fn, _x())


def close_through_yield_from(x):
    log = []

    def sub():
        try:
            yield x + 1
        finally:
            log.append("sub finally")

    def body():
        yield from sub()
        yield x + 2
    g = body()
    first = next(g)
    g.close()
    return first, log


def close_sub_error_raised_in_body(x):
    log = []

    def sub():
        try:
            yield x + 1
        finally:
            log.append("sub finally")
            raise KeyError("from sub")

    def body():
        try:
            yield from sub()
        except KeyError as e:
            log.append(("body caught", e.args))
        finally:
            log.append("body finally")
    g = body()
    first = next(g)
    g.close()
    return first, log


def test_close_inside_yield_from_closes_sub_generator_first():
    check_one_graph_like_torch(close_through_yield_from, _x())


@pytest.mark.parametrize("fn", [close_context_is_consumers_exception,
                                close_sub_error_raised_in_body], ids=lambda f: f.__name__)
def test_context_from_outside_the_trace_runs_eagerly(fn):
    """A raise whose __context__ would be the compiled frame's caller's exception (unknown
    to the trace): eager's values."""
    run_all(fn, _x())


def throw_through_yield_from(x):
    def sub():
        try:
            yield x + 1
        except ValueError:
            yield x + 2

    def body():
        yield from sub()
    g = body()
    first = next(g)
    return first, g.throw(ValueError), list(g)


def close_body_yields_again(x):
    def body():
        try:
            yield x + 1
        except GeneratorExit:
            yield x + 2
    g = body()
    first = next(g)
    try:
        g.close()
    except RuntimeError as e:
        return first, str(e)
    return first


def throw_into_new_generator(x):
    def body():
        yield x + 1
    try:
        body().throw(ValueError(7))
    except ValueError as e:
        return x + 1, e.args
    return x


@pytest.mark.parametrize("fn,words", [
    (throw_through_yield_from, "yield from"),
    (close_body_yields_again, "ignored GeneratorExit"),
    (throw_into_new_generator, "not suspended at a yield"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_refused_runs_eagerly_with_eager_result(fn, words):
    _, _, fd, _ = run_all(fn, _x())
    ferrodyn.reset()
    reasons = ferrodyn.explain(fn)(_x()).break_reasons
    assert any(words in str(r) for r in reasons), reasons
    assert fd == 0

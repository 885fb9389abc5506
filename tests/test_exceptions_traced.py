"""Exceptions raised and handled inside traced code: the handler CPython runs, the exception's
args, `__context__`/`__cause__`/`__suppress_context__` (set by raise, `raise ... from`, written
by the code), `sys.exc_info()`/`sys.exception()`, bare `raise` in an inlined callee, errors of
builtin operations on constants, AttributeError of user objects and StopIteration of `next()`,
all in one graph. Each case is compared with eager (values, exception types) and with
torch.compile's graph count; what is not modelled exactly (a context chain with a cycle, an
exception leaving the frame) runs eagerly with eager's result; context chains with a cycle
are walked as CPython's `_PyErr_SetObject` walks them. Cases after PyTorch's
test/dynamo/test_exceptions.py, written afresh."""

import sys

import pytest
import torch

import ferrodyn
from compiled_vs_eager import check_one_graph_like_torch, run_all
from counting_backend import CountingBackend

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _x():
    return torch.arange(4.0)


def _inner_reraises(x):
    try:
        raise NotImplementedError("inner")
    except NotImplementedError:
        x.add_(1)
        raise


def reraise_from_inlined_callee(x):
    x = x.clone()
    try:
        _inner_reraises(x)
    except NotImplementedError as e:
        return x * 2, e.args
    return x


def handler_order_and_finally(x):
    log = []
    try:
        x = x.sin()
        raise KeyError("k")
    except IndexError:
        log.append("index")
    except LookupError as e:
        log.append(("lookup", type(e).__name__, e.args))
    else:
        log.append("else")
    finally:
        log.append("finally")
    return x.cos(), log


def raise_from_sets_cause(x):
    try:
        try:
            raise KeyError("k")
        except KeyError as e:
            raise ValueError("v") from e
    except ValueError as e2:
        return x + 1, type(e2.__cause__).__name__, e2.__suppress_context__, \
            type(e2.__context__).__name__


def raise_from_none_hides_context(x):
    try:
        try:
            {}["missing"]
        except KeyError:
            raise ValueError("v") from None
    except ValueError as e:
        return x + 1, e.__cause__ is None, e.__suppress_context__, \
            type(e.__context__).__name__


def context_of_try_and_finally(x):
    try:
        try:
            te = TypeError(1)
            raise te
        finally:
            ve = ValueError(2)
            raise ve
    except Exception as e:
        exc = e
    return x.sin(), exc is ve, exc.__context__ is te, te.__context__ is None


def context_of_except_and_finally(x):
    try:
        try:
            te = TypeError(1)
            raise te
        except Exception:
            ve = ValueError(2)
            raise ve
        finally:
            oe = OSError(3)
            raise oe
    except Exception as e:
        exc = e
    return x.sin(), exc is oe, exc.__context__ is ve, ve.__context__ is te


def raise_cuts_context_cycle(x):
    try:
        try:
            raise AssertionError
        except AssertionError as a_:
            a = a_
            try:
                raise BytesWarning
            except BytesWarning as b_:
                b = b_
                try:
                    raise ConnectionError
                except ConnectionError as c_:
                    c = c_
                    raise a
    except AssertionError as e:
        exc = e
    return x.sin(), exc is a, a.__context__ is c, c.__context__ is b, b.__context__ is None


def context_attributes_written(x):
    try:
        raise Exception
    except Exception as exc:
        e = exc
    before = [e.__context__ is None, e.__cause__ is None, e.__suppress_context__]
    e.__context__ = NameError()
    e.__cause__ = None  # setting __cause__ (even to None) suppresses the context
    after = [type(e.__context__).__name__, e.__cause__ is None, e.__suppress_context__]
    e.__suppress_context__ = False
    return x + 1, before, after, e.__suppress_context__


def exc_info_inside_and_after(x):
    outside = sys.exc_info()
    try:
        raise ValueError("boom", 2)
    except ValueError:
        t, v, tb = sys.exc_info()
        inside = (t is ValueError, v.args, tb is None, sys.exception() is v)
    return x * 2, outside, inside, sys.exc_info()[0] is None, sys.exception() is None


def _reads_exc_info():
    return sys.exc_info()[0]


def exc_info_seen_by_inlined_callee(x):
    try:
        raise KeyError(1)
    except KeyError:
        seen = _reads_exc_info()
    return x + 1, seen is KeyError, _reads_exc_info() is None


def bare_raise_without_exception(x):
    try:
        raise
    except RuntimeError as e:
        return x + 1, e.args


def str_repr_args(x):
    try:
        raise ValueError("boom", 3)
    except ValueError as e:
        return x + 1, str(e), repr(e), e.args, str(KeyError("k"))


def builtin_errors_on_constants(x):
    caught = []
    for thunk in (lambda: 1 / 0, lambda: int("nope"), lambda: {}["k"]):
        try:
            thunk()
        except (ZeroDivisionError, ValueError, LookupError) as e:
            caught.append((type(e).__name__, str(e)))
    return x + len(caught), caught


def generator_exit_is_not_an_exception(x):
    try:
        raise GeneratorExit
    except Exception:
        return x.sin()
    except BaseException:
        return x.cos()


def stop_iteration_of_next(x):
    def gen():
        yield 1
        return "done"
    it = iter([1])
    next(it)
    try:
        next(it)
    except StopIteration as e:
        plain = (e.args, e.value)
    g = gen()
    next(g)
    try:
        next(g)
    except StopIteration as e:
        first = (e.args, e.value)
    try:
        next(g)
    except StopIteration as e:
        again = (e.args, e.value)
    return x + next(iter([]), 5), plain, first, again


def active_exception_kept_after_inner_handler(x):
    seen = []
    try:
        try:
            1 / 0
        except ZeroDivisionError:
            for exc in (KeyError, IndexError):
                try:
                    raise exc
                except exc as e:
                    seen.append(type(e.__context__).__name__)
            raise
    except ZeroDivisionError as e:
        seen.append(type(e).__name__)
    return x + 1, seen


class WithFields(Exception):
    def __init__(self, a, b=None):  # no super().__init__: args stay BaseException.__new__'s
        self.a = a
        self.b = b


class WithCode(ValueError):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


def user_exception_init_runs(x):
    r = []
    try:
        raise WithFields(2, b=3)
    except ValueError:
        r.append("value")
    except WithFields as e:
        r.append((e.a, e.b, e.args))
    try:
        raise WithCode("bad", 7)
    except ValueError as e:
        r.append((e.args, e.code, isinstance(e, WithCode)))
    return x + r[0][0] + r[1][1], r


@pytest.mark.parametrize("fn", [
    user_exception_init_runs, reraise_from_inlined_callee, handler_order_and_finally,
    builtin_errors_on_constants, generator_exit_is_not_an_exception, stop_iteration_of_next,
    str_repr_args,
], ids=lambda f: f.__name__)
def test_one_graph_like_eager(fn):
    check_one_graph_like_torch(fn, _x())


@pytest.mark.parametrize("fn", [
    raise_from_sets_cause, raise_from_none_hides_context, context_of_try_and_finally,
    context_of_except_and_finally, raise_cuts_context_cycle, context_attributes_written,
    exc_info_inside_and_after, exc_info_seen_by_inlined_callee, bare_raise_without_exception,
    active_exception_kept_after_inner_handler,
], ids=lambda f: f.__name__)
def test_context_from_outside_the_trace_is_guarded(fn):
    """What depends on the exception the compiled frame's caller handles (a raise's
    __context__ read, sys.exc_info(), a bare raise with none in the frame) is traced with the
    caller handling none, under a guard that says so: one graph, eager's values."""
    check_one_graph_like_torch(fn, _x())


class Plain:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def read_or_default(x, obj):
    try:
        scale = obj.scale
    except AttributeError as e:
        scale, why = 3, str(e)
    else:
        why = None
    return x * scale, why


def test_attribute_error_of_user_object_is_guarded():
    """The missing attribute's AttributeError is caught in the graph (CPython's message); the
    absence is guarded: an object that has it recompiles and reads it."""
    fd, tc = CountingBackend(), CountingBackend()
    f = ferrodyn.compile(read_or_default, backend=fd)
    t = torch.compile(read_or_default, backend=tc)
    for obj in (Plain(), Plain(), Plain(scale=5)):
        want = read_or_default(_x(), obj)
        got = f(_x(), obj)
        assert torch.equal(want[0], got[0]) and want[1] == got[1]
        t(_x(), obj)
    assert fd.count == 2 and tc.count <= fd.count, (fd.count, tc.count)


def _cycle():
    try:
        raise ValueError(1)
    except ValueError as ex:
        ex.__context__ = ex
        raise TypeError(2)


def context_chain_with_cycle(x):
    try:
        _cycle()
    except Exception as e:
        exc = e
    return x + 1, type(exc.__context__).__name__, exc.__context__.__context__ is exc.__context__


def context_cycle_at_head(x):
    A, B, C = AssertionError, BytesWarning, ConnectionError
    try:
        try:
            raise A()
        except A as _a:
            a = _a
            try:
                raise B()
            except B as _b:
                b = _b
                try:
                    raise C()
                except C as _c:
                    c = _c
                    a.__context__ = c
                    raise c
    except C as e:
        exc = e
    return x + 1, [exc is c, c.__context__ is b, b.__context__ is a, a.__context__ is c]


def longer_chain_with_cycle(x):
    A, B, C, D, E = AssertionError, BytesWarning, ConnectionError, DeprecationWarning, Exception
    try:
        try:
            raise A
        except A as _a:
            a = _a
            try:
                raise B
            except B as _b:
                b = _b
                try:
                    raise C
                except C as _c:
                    c = _c
                    a.__context__ = c
                    try:
                        raise D
                    except D as _d:
                        d = _d
                        e = E()
                        raise e
    except E as ee:
        exc = ee
    return x * 2, [exc is e, e.__context__ is d, d.__context__ is c, c.__context__ is b,
                   b.__context__ is a, a.__context__ is c]


@pytest.mark.parametrize("fn", [context_chain_with_cycle, context_cycle_at_head,
                                longer_chain_with_cycle], ids=lambda f: f.__name__)
def test_context_chain_with_cycle_one_graph(fn):
    check_one_graph_like_torch(fn, _x())


def exception_leaves_the_frame(x):
    y = x.sin()
    raise ValueError("escaped", y.shape[0])


def raised_exception_returned(x):
    try:
        raise ValueError("raised", 1)
    except ValueError as e:
        return x + 1, e


@pytest.mark.parametrize("fn,words", [
    (raised_exception_returned, "ValueError exception (raised"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_refused_runs_eagerly_with_eager_result(fn, words):
    """Not modelled exactly: the frame runs eagerly (eager's values and exception), the
    refusal is named."""
    want, got, fd, tc = run_all(fn, _x())
    assert type(want[1]) is type(got[1]) and want[1].args == got[1].args
    ferrodyn.reset()
    reasons = ferrodyn.explain(fn)(_x()).break_reasons
    assert any(words in str(r) for r in reasons), reasons
    assert fd == 0


def test_exception_made_in_the_frame_is_returned():
    """A never-raised exception made in the trace is rebuilt for the caller: class, args
    (a tensor among them), the chaining attributes the code set, and identity (returned twice,
    one object), in one graph like torch.compile."""
    def fn(x):
        v = ValueError(1, x * 2)
        v.__context__ = TypeError("ctx")
        k = KeyError("k")
        k.__cause__ = v
        return x.sin(), v, k, k

    fd, tc = CountingBackend(), CountingBackend()
    want = fn(_x())
    got = ferrodyn.compile(fn, backend=fd)(_x())
    torch.compile(fn, backend=tc)(_x())
    torch._dynamo.reset()
    assert torch.equal(want[0], got[0])
    v, k = got[1], got[2]
    assert type(v) is ValueError and v.args[0] == 1 and torch.equal(v.args[1], want[1].args[1])
    assert type(v.__context__) is TypeError and v.__context__.args == ("ctx",)
    assert v.__cause__ is None and v.__suppress_context__ is False
    assert type(k) is KeyError and k.args == ("k",) and k.__cause__ is v
    assert k.__suppress_context__ is True and k.__context__ is None
    assert got[3] is k and v.__traceback__ is None
    assert fd.count == 1 and tc.count == 1


def test_exception_leaving_frame_keeps_message():
    """An exception the traced code does not handle is raised by the eager run: same type,
    same args."""
    fd, tc = CountingBackend(), CountingBackend()
    f = ferrodyn.compile(exception_leaves_the_frame, backend=fd)
    with pytest.raises(ValueError) as got:
        f(_x())
    with pytest.raises(ValueError) as want:
        exception_leaves_the_frame(_x())
    with pytest.raises(ValueError):
        torch.compile(exception_leaves_the_frame, backend=tc)(_x())
    torch._dynamo.reset()
    assert got.value.args == want.value.args
    assert fd.count == 0 and tc.count == 0

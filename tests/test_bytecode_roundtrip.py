"""ferrodyn.bytecode: decode -> assemble reproduces every code object of a large set of
standard-library modules byte for byte (co_code, exception table, location table, stack size,
flags), and re-assembled or rewritten functions behave like the originals.

The same check runs on an interpreter without torch: `python3.13 tests/bytecode_roundtrip.py`."""

import asyncio
import contextlib
import dis
import sys

import pytest

from bytecode_roundtrip import MODULES, check_code, iter_codes, module_code
from ferrodyn import bytecode as bc
from ferrodyn.bytecode import Inst


@pytest.mark.parametrize("modname", MODULES)
def test_stdlib_module_round_trips_exactly(modname):
    n, bad = 0, []
    for code in iter_codes(module_code(modname)):
        n += 1
        bad += check_code(bc, code)
    assert n > 0 and bad == []


# -- behaviour of re-assembled and rewritten functions ---------------------------------------

def _loops_and_handlers(xs, n):
    total = 0
    for i, x in enumerate(xs):
        if i % 2:
            continue
        try:
            total += 10 // x
        except ZeroDivisionError:
            total -= 1
        finally:
            total += 100
        while n > 0:
            n -= 1
            if n == 3:
                break
    with contextlib.suppress(KeyError):
        {}["missing"]
    return total, n, [y * 2 for y in xs if y], {k: v for k, v in zip("abc", xs)}


def _generator(n):
    for i in range(n):
        got = yield i
        if got:
            yield from range(got)


async def _coroutine(n):
    await asyncio.sleep(0)
    return n * 2


def _matcher(v):
    match v:
        case [a, b]:
            return a + b
        case {"k": k}:
            return k
        case int(i) if i > 3:
            return -i
        case _:
            return None


def _rebuild(fn, code):
    return type(fn)(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _same_behaviour(fn, new_fn):
    assert new_fn([1, 0, 2, 5, 0], 7) == fn([1, 0, 2, 5, 0], 7)
    assert new_fn([], 0) == fn([], 0)


def test_reassembled_functions_behave_like_the_originals():
    new = _rebuild(_loops_and_handlers, bc.assemble(bc.decode(_loops_and_handlers.__code__),
                                                    _loops_and_handlers.__code__))
    _same_behaviour(_loops_and_handlers, new)
    gen = _rebuild(_generator, bc.assemble(bc.decode(_generator.__code__), _generator.__code__))
    g1, g2 = _generator(4), gen(4)
    assert [next(g1), g1.send(2), next(g1), next(g1)] == [next(g2), g2.send(2), next(g2), next(g2)]
    coro = _rebuild(_coroutine, bc.assemble(bc.decode(_coroutine.__code__), _coroutine.__code__))
    assert asyncio.run(coro(21)) == 42
    m = _rebuild(_matcher, bc.assemble(bc.decode(_matcher.__code__), _matcher.__code__))
    for v in ([1, 2], {"k": 9}, 7, 2, "s"):
        assert m(v) == _matcher(v)


def _pad_with_nops(insts, every, count):
    """Insert `count` NOPs before every `every`-th instruction (same location and handler), so
    every jump and exception range moves."""
    out = []
    for k, inst in enumerate(insts):
        if k % every == 0 and inst.opname not in ("RESUME", "RETURN_GENERATOR", "POP_TOP"):
            out += [Inst("NOP", positions=inst.positions, exn=inst.exn) for _ in range(count)]
        out.append(inst)
    return out


@pytest.mark.parametrize("count", [1, 40, 300])
def test_rewritten_code_resolves_jumps_and_extended_args(count):
    code = _loops_and_handlers.__code__
    insts = _pad_with_nops(bc.decode(code), 3, count)
    new = bc.assemble(insts, code)
    _same_behaviour(_loops_and_handlers, _rebuild(_loops_and_handlers, new))
    ops = [i.opname for i in dis.get_instructions(new)]
    assert ("EXTENDED_ARG" in ops) == (count >= 40)
    assert new.co_stacksize == code.co_stacksize
    # a second round trip of the rewritten code is exact again
    assert check_code(bc, new) == []


def test_builder_makes_a_working_function_with_keywords_and_a_handler():
    def template(a, b):
        pass

    b = bc.CodeBuilder(varnames=template.__code__.co_varnames)
    # return sorted(a, key=None, reverse=b), catching TypeError -> "bad"
    handler = b.inst("POP_TOP")
    body = [*b.call_prefix(), b.load_global("sorted", push_null=False)] if sys.version_info < (3, 13) \
        else [b.load_global("sorted"), *b.call_infix()]
    body += [b.load_fast("a"), b.load_const(None), b.load_fast("b"),
             *b.call(3, ("key", "reverse")), b.inst("RETURN_VALUE")]
    exn = bc.ExnHandler(handler, 0, False)
    for i in body:
        i.exn = exn
    tail = [handler, b.load_const("bad"), b.inst("RETURN_VALUE")]
    # PUSH_EXC_INFO-less handler: the exception is on the stack, popped, and a value returned
    insts = [b.resume(), *body, *tail]
    code = bc.assemble(insts, template.__code__, co_consts=tuple(b.consts),
                       co_names=tuple(b.names), co_varnames=tuple(b.varnames),
                       co_nlocals=len(b.varnames))
    fn = _rebuild(template, code)
    assert fn([3, 1, 2], True) == [3, 2, 1]
    assert fn([3, None], False) == "bad"
    assert code.co_stacksize >= 4


def test_bad_instruction_lists_are_refused_with_a_clear_error():
    code = _loops_and_handlers.__code__
    with pytest.raises(ValueError, match="no target"):
        bc.assemble([Inst("RESUME", 0), Inst("JUMP_FORWARD", target=Inst("NOP"))], code)
    with pytest.raises(ValueError, match="needs an argument"):
        bc.assemble([Inst("RESUME", 0), Inst("LOAD_CONST")], code)
    with pytest.raises(ValueError, match="underflow"):
        bc.assemble([Inst("RESUME", 0), Inst("POP_TOP"), Inst("RETURN_VALUE")], code)

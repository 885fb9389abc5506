"""A one-page walkthrough of the converter's loop, runnable: frame -> bytecode -> trackers ->
graph -> guards -> output spec. Read top to bottom; every step asserts what it claims.

1. The frontend hands `trace_frame` a frame: its code, globals, builtins, the argument slots
   (co_varnames order) and the closure cells.
2. The InstructionTranslator decodes the bytecode (`symbolic/instructions.py`) and steps through
   it, one handler per opcode (`symbolic/opcodes_*.py`, registered by name).
3. Arguments start as LazyVariables carrying a Source (`L['x']`). When an instruction first
   uses one (it reaches the stack), the builder makes a tracker and installs the guards that
   value needs: a tensor becomes a graph placeholder guarded by TENSOR_MATCH, an int becomes a
   constant guarded by TYPE_MATCH + EQUALS.
4. Tensor operations run on fake tensors (shapes, dtypes) and are recorded as fx nodes;
   Python-level work (ints, lists, control flow, user functions) happens at trace time.
5. RETURN_VALUE ends the trace: the returned tracker becomes an output spec (graph outputs,
   constants, values from the frame) and the graph returns a flat tuple.
"""

import builtins

import torch

from ferrodyn.guard_spec import GuardKind
from ferrodyn.source import LocalSource
from ferrodyn.symbolic import trace_frame
from ferrodyn.symbolic.instructions import decode
from ferrodyn.trace_result import OutConst, OutGraph, OutTuple


def scale(v, k):
    return v * k


def user_fn(x, n, unused):
    y = x
    for i in range(n):          # unrolled at trace time: n is a guarded constant
        y = scale(y, i + 1)     # a user function: inlined, not a graph call
    return torch.relu(y), n * 2


def test_walkthrough():
    x = torch.randn(4)
    # 1. the frame, as the frontend sees it
    code = user_fn.__code__
    args = (x, 3, "ignored")
    assert code.co_varnames[:3] == ("x", "n", "unused")

    # 2. the bytecode the translator steps through
    opnames = [i.opname for i in decode(code)]
    assert "FOR_ITER" in opnames and "RETURN_VALUE" in opnames

    result = trace_frame(code, user_fn.__globals__, builtins.__dict__, args, None)

    # 3. guards: installed for what was used, with Sources naming where it came from
    kinds = {(g.source.name() if g.source else None, g.kind) for g in result.guards}
    assert ("L['x']", GuardKind.TENSOR_MATCH) in kinds
    assert ("L['n']", GuardKind.EQUALS) in kinds
    assert not any(name == "L['unused']" for name, _ in kinds)   # never used, never guarded
    assert ("G['scale']", GuardKind.ID_MATCH) in kinds            # the inlined function
    assert (None, GuardKind.GLOBAL_STATE) in kinds

    # 4. the graph: one placeholder per input Source, the ops of the unrolled loop
    assert result.graph_inputs == [LocalSource(0, "x")]
    assert result.example_inputs[0] is x
    ops = [n.target for n in result.graph.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.relu) == 1 and len(ops) == 4           # 3 multiplications + relu

    # 5. the output spec: graph output 0 and a constant folded at trace time
    assert result.output == OutTuple((OutGraph(0), OutConst(6)))
    (relu_out,) = result.graph(x)
    torch.testing.assert_close(relu_out, user_fn(x, 3, None)[0])

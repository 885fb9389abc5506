"""Errors and control-flow signals of the converter.

Owns: the user-facing exceptions (each catchable as its torch.compile counterpart), the closed
set of graph-break reasons (declared once, with an explanation and a hint), the public
`graph_break()` marker, and the internal control-flow signals, which are kept apart from errors.
"""

from __future__ import annotations

import enum

import torch._dynamo.exc as _torch_exc


class BreakReason(enum.Enum):
    """Why a frame could not be captured whole. Value: (explanation, hint)."""

    UNSUPPORTED_OPCODE = ("bytecode instruction not supported", "rewrite the construct or run it eagerly")
    UNSUPPORTED_CALL = ("call of a function the converter cannot trace", "move the call out of the compiled region")
    UNSUPPORTED_BUILTIN = ("builtin used in a way the converter cannot trace", "")
    DATA_DEPENDENT = ("control flow or value depends on tensor data", "use torch.where / torch.cond, or move it out")
    SIDE_EFFECT = ("mutation of state outside the frame that cannot be replayed", "return the value instead of mutating")
    EXCEPTION = ("exception handling / raising inside the traced code", "")
    UNSUPPORTED_TYPE = ("a value of a type the converter does not model", "")
    GENERATOR = ("a generator or coroutine used in a way the converter does not model "
                 "(throw, escaping the frame, left suspended where close() runs code, async)",
                 "consume the generator inside the compiled function")
    RECURSION_LIMIT = ("inlining went too deep", "")
    GRAPH_BREAK = ("explicit graph break (ferrodyn.graph_break / torch._dynamo.graph_break)", "")
    OTHER = ("unsupported construct", "")

    @property
    def explanation(self) -> str:
        return self.value[0]

    @property
    def hint(self) -> str:
        return self.value[1]


class Unsupported(_torch_exc.Unsupported):
    """A construct the converter cannot capture. With `fullgraph=True` it reaches the user, naming
    the construct and the user's file and line; otherwise the frame runs eagerly."""

    def __init__(self, msg: str, reason: BreakReason = BreakReason.OTHER, *,
                 filename: str | None = None, lineno: int | None = None):
        where = f" (at {filename}:{lineno})" if filename is not None else ""
        full = f"{reason.explanation}: {msg}{where}"
        if reason.hint:
            full += f"\n  hint: {reason.hint}"
        super().__init__(full, gb_type=reason.name)
        self.reason = reason
        self.construct = msg
        self.filename = filename
        self.lineno = lineno

    def at(self, filename: str, lineno: int | None) -> "Unsupported":
        """The same refusal, of the same class, naming the user's file and line."""
        located = Unsupported.__new__(type(self))
        Unsupported.__init__(located, self.construct, self.reason, filename=filename,
                             lineno=lineno)
        return located


class RaisedWhileTracing(Unsupported):
    """A real operation on the traced values raised at trace time (an attribute missing on a
    constant, an unhashable key, ...), so the same instruction raises in eager unless what the
    trace folded differs there (`torch.compiler.is_compiling()` is True in the trace). When no
    handler of the traced frames covers it, the frame runs eagerly (torch.compile's observed
    exception): breaking the graph there would run the raising instruction after a prefix traced
    with `is_compiling()` true, and code that avoids the error only when not compiling raises."""

    def __init__(self, msg: str):
        super().__init__(msg, BreakReason.EXCEPTION)


class BackendCompilerFailed(_torch_exc.BackendCompilerFailed):
    """The backend raised while compiling a captured graph."""

    def __init__(self, backend_fn: object, inner_exception: Exception):
        super().__init__(backend_fn, inner_exception, None)


def graph_break() -> None:
    """Break the graph here: code before the call and code after it are captured as separate
    graphs (eagerly, it does nothing). `torch._dynamo.graph_break()` does the same."""


class RestartAnalysis(Exception):
    """Control-flow signal (not an error): trace the frame again with what was learned."""

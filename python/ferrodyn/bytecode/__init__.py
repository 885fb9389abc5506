"""A bytecode assembler for CPython 3.11, 3.12 and 3.13: code object <-> instruction list.

Owns the instruction model (`Inst`, `ExnHandler`), decoding a code object into it (decode.py)
and assembling one back into a code object (assemble.py), with everything CPython derives from
the instruction stream: jump arguments (EXTENDED_ARG prefixes resolved to a fixed point), inline
cache entries, the exception table (exception_table.py), the location table (linetable.py),
the stack depth (stackdepth.py) and `co_flags`. Version tables live in opinfo.py.

Does not own what the instructions mean to the converter (symbolic/) or which code ferrodyn
generates (codegen.py, resume.py). This package imports only the standard library, with
relative imports, so it can be loaded (and tested) on an interpreter without torch or `_C`.
"""

from .assemble import CodeBuilder, assemble, compute_flags
from .decode import decode
from .instruction import ExnHandler, Inst, Positions

__all__ = ["Inst", "ExnHandler", "Positions", "decode", "assemble", "compute_flags", "CodeBuilder"]

"""Python modules as values: `PythonModuleVariable` owns attribute reads of a module (`math`,
`torch`, a config module): attributes of torch modules are not guarded (torch is not patched
between calls) except mutable config scalars and plain objects holding state (`PRINT_OPTS`);
others are guarded like any global. Does not own
globals of the frame (symbolic/opcodes_load_store.py).
"""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass

from ferrodyn.exc import BreakReason
from ferrodyn.source import AttrSource
from ferrodyn.variables.base import LazyVariable, VariableTracker, raised_while_tracing, unsupported


@dataclass(frozen=True, eq=False)
class PythonModuleVariable(VariableTracker):
    """A Python module (`math`, `torch`, a config module). Attributes of torch modules are not
    guarded (torch is not patched between calls); others are guarded like any global."""

    value: types.ModuleType = None  # type: ignore[assignment]

    def python_type(self):
        return types.ModuleType

    def as_python_constant(self):
        return self.value

    def identity(self):
        return ("obj", id(self.value))

    def describe(self):
        return f"module {self.value.__name__}"

    def var_getattr(self, tx, name):
        from ferrodyn.variables.builder import build_unsourced
        import torch
        try:
            value = getattr(self.value, name)
        except AttributeError as e:
            raised_while_tracing(str(e))
        modname = self.value.__name__
        flags = _torch_flags_object(tx, self.source, name, value)
        if flags is not None:
            return flags
        if (modname == "torch" or modname.startswith("torch.")) and \
                not isinstance(value, torch.Tensor) and \
                not _is_mutable_config(value) and not _is_mutable_instance(value):
            if isinstance(value, types.ModuleType) and self.source is not None:
                # a submodule keeps its Source (not guarded itself) so that its mutable config
                # scalars (`torch.backends.cudnn.enabled`) are guarded where they are read
                return PythonModuleVariable(value=value, source=AttrSource(self.source, name))
            return build_unsourced(value)
        if self.source is None:
            return build_unsourced(value)
        return LazyVariable(source=AttrSource(self.source, name), value=value)

    def has_attr(self, tx, name):
        return hasattr(self.value, name)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutConst
        return OutConst(self.value) if self.source is None else super().reconstruct(tx)


def _is_mutable_config(value) -> bool:
    return isinstance(value, (bool, int, float, str)) and not isinstance(value, type)


def _is_mutable_instance(value) -> bool:
    """A plain object whose attributes torch's setters change (`torch._tensor_str.PRINT_OPTS`):
    read through its Source, so what the trace reads of it is guarded like any global's."""
    return isinstance(getattr(value, "__dict__", None), dict) and not callable(value) and \
        not isinstance(value, (type, types.ModuleType, enum.Enum))


def _torch_flags_object(tx, source, name, value):
    """`torch.backends.cuda.matmul` (a `cuBLASModule`: its flags are read through
    `__getattr__` from torch's global context): a TorchFlagsVariable, or None."""
    import torch
    cls = getattr(getattr(torch.backends, "cuda", None), "cuBLASModule", None)
    if cls is None or type(value) is not cls:
        return None
    return TorchFlagsVariable(value=value, source=None if source is None else
                              AttrSource(source, name))


@dataclass(frozen=True, eq=False)
class TorchFlagsVariable(VariableTracker):
    """An object of torch global flags read as attributes (`torch.backends.cuda.matmul`): each
    scalar flag read is guarded (EQUALS on its Source), so flipping it recompiles."""

    value: object = None

    def describe(self):
        return f"torch flags {type(self.value).__name__}"

    def var_getattr(self, tx, name):
        try:
            value = getattr(self.value, name)
        except AttributeError as e:
            raised_while_tracing(str(e))
        if not _is_mutable_config(value) or self.source is None:
            unsupported(f"{self.describe()}.{name}", BreakReason.UNSUPPORTED_TYPE)
        return LazyVariable(source=AttrSource(self.source, name), value=value)

    def has_attr(self, tx, name):
        return hasattr(self.value, name)
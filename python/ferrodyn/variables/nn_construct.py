"""torch.nn modules created inside traced code (`loss_fct = nn.CrossEntropyLoss()` in a
model's forward): which can be built at trace time, and building them.

Owns `is_stateless_torch_module_class`, `construct_stateless_torch_module` (called by
user_objects.construct_instance) and `NewTorchModuleVariable` (such a module escaping the frame
is built again by the entry, per call). Does not own calls of modules (nn_module.py) or modules
from the frame (builder.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import is_constant_value
from ferrodyn.variables.nn_module import NNModuleVariable

# torch.nn's global registration hooks: they would run when a module is built at trace time
_MODULE_REGISTRATION_HOOKS = ("_global_module_registration_hooks",
                              "_global_parameter_registration_hooks",
                              "_global_buffer_registration_hooks")


def _is_torch_nn_class(klass: type) -> bool:
    return klass.__module__.startswith("torch.nn.modules.")


# names whose definition in a subclass would run its own code while the instance is built
_CONSTRUCTION_HOOKS = ("__init__", "__new__", "__setattr__", "__getattr__", "__getattribute__",
                       "__delattr__", "__init_subclass__", "__set_name__")
# methods torch.nn's constructors never call
_NOT_CALLED_BY_INIT = ("forward", "extra_repr")
# descriptors every class without a __dict__-owning base gets (not user code)
_SLOT_DESCRIPTORS = ("__dict__", "__weakref__")


def _builds_with_torch_code_only(cls: type) -> bool:
    """A subclass made outside torch.nn (transformers' `SiLUActivation(nn.Module)` with only a
    `forward`) whose construction runs torch.nn's code alone: no class of its own defines a
    constructor or attribute hook or a data descriptor an `__init__` store could reach, and
    when the `__init__` that runs is not `nn.Module.__init__` itself (which calls no method of
    the instance), they define no function but `forward`/`extra_repr` (a torch `__init__` may
    call `self.reset_parameters()` and the like)."""
    import torch
    own = [k for k in cls.__mro__ if k is not object and not _is_torch_nn_class(k)]
    if not own or not any(_is_torch_nn_class(k) for k in cls.__mro__):
        return False
    plain_init = next(k for k in cls.__mro__ if "__init__" in vars(k)) is torch.nn.Module
    for klass in own:
        for name, v in vars(klass).items():
            if name in _CONSTRUCTION_HOOKS:
                return False
            if name not in _SLOT_DESCRIPTORS and (hasattr(type(v), "__set__")
                                                  or hasattr(type(v), "__delete__")):
                return False
            if not plain_init and callable(v) and name not in _NOT_CALLED_BY_INIT:
                return False
    return True


def is_stateless_torch_module_class(cls: type) -> bool:
    """One of torch.nn's own module classes (losses, activations, dropout, flatten...), or a
    subclass built by their code alone (`_builds_with_torch_code_only`): its `__init__`
    touches nothing but the new object (torch/nn/modules)."""
    if type(cls).__call__ is not type.__call__:
        return False
    return _is_torch_nn_class(cls) or _builds_with_torch_code_only(cls)


def construct_stateless_torch_module(tx, cls: type, args, kwargs) -> VariableTracker:
    """`nn.CrossEntropyLoss()` in traced code: built at trace time from constant arguments, as
    long as it owns no parameter or tensor buffer (they would be made at trace time, once,
    consuming the RNG) and no global registration hook would see it. The object is private to
    the trace (no source): its calls are inlined and a mutation of it is refused; when it escapes
    the frame (returned, stored into a module) the entry builds it again from the same arguments
    (`NewTorchModuleVariable`), so no caller can tell it from the one eager code builds."""
    consts = [tx.realize(a) for a in (*args, *kwargs.values())]
    if not all(c.is_python_constant() for c in consts) or \
            not all(is_constant_value(c.as_python_constant()) for c in consts):
        unsupported(f"creating a {cls.__name__} from non-constant arguments inside the traced "
                    f"code", BreakReason.UNSUPPORTED_CALL)
    mm = torch.nn.modules.module
    if any(getattr(mm, h, None) for h in _MODULE_REGISTRATION_HOOKS):
        unsupported(f"creating a {cls.__name__} while global module registration hooks are "
                    f"installed", BreakReason.UNSUPPORTED_CALL)
    pos = [tx.realize(a).as_python_constant() for a in args]
    kw = {k: tx.realize(v).as_python_constant() for k, v in kwargs.items()}
    rng = torch.random.get_rng_state()
    try:
        module = cls(*pos, **kw)
    except Exception as e:  # eager raises it: the frame runs eagerly and does
        unsupported(f"{cls.__name__}(...) raised {type(e).__name__}: {e}", BreakReason.EXCEPTION)
    finally:
        changed = not torch.equal(rng, torch.random.get_rng_state())
        if changed:
            torch.random.set_rng_state(rng)
    if changed or any(True for _ in module.parameters()) or \
            any(b is not None for b in module.buffers()):
        unsupported(f"creating a {cls.__name__} (it owns parameters or buffers) inside the "
                    f"traced code", BreakReason.UNSUPPORTED_CALL)
    return NewTorchModuleVariable(value=module, ctor=(cls, tuple(pos), tuple(kw.items())))


def rebuild_torch_module(cls: type, args: tuple, kwargs: tuple) -> Any:
    """`cls(*args, **dict(kwargs))` (called by generated entries: a module built in the frame
    that escapes it, made again per call as eager makes it)."""
    return cls(*args, **dict(kwargs))


@dataclass(frozen=True, eq=False)
class NewTorchModuleVariable(NNModuleVariable):
    """A stateless torch.nn module built in the frame (`construct_stateless_torch_module`): the
    object made at trace time is private to the trace (its forward is inlined, it is never
    mutated: it has no Source); when it escapes (stored into a module by `add_module`,
    `ModuleList.append`, `self.act = nn.Tanh()`, or returned) the entry builds a fresh one from
    the same constant arguments, once per call however often it is reached, as each eager call
    builds its own. Its construction has no effect the frame could see (no parameters, no RNG,
    no registration hook: checked when it is built and when it is rebuilt)."""
    ctor: tuple = ()  # (cls, positional constants, keyword constants as pairs)

    def reconstruct(self, tx):
        from ferrodyn.trace_result import OutCall, OutConst
        cls, args, kwargs = self.ctor
        if any(getattr(torch.nn.modules.module, h, None) for h in _MODULE_REGISTRATION_HOOKS):
            unsupported(f"a {cls.__name__} built in the frame escaping it while global module "
                        f"registration hooks are installed", BreakReason.UNSUPPORTED_CALL)
        return tx.output.side_effects.shared(self.value, lambda: OutCall(
            rebuild_torch_module, (OutConst(cls), OutConst(args), OutConst(kwargs))))

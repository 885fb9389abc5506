"""torch.nn modules created inside traced code (`loss_fct = nn.CrossEntropyLoss()` in a
model's forward): which can be built at trace time, and building them.

Owns `is_stateless_torch_module_class` and `construct_stateless_torch_module` (called by
user_objects.construct_instance). Does not own calls of modules (nn_module.py) or modules
from the frame (builder.py).
"""

from __future__ import annotations

from ferrodyn.exc import BreakReason
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.constant import is_constant_value

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
    the trace (no source): its calls are inlined, a mutation of it or its escape from the frame
    (returned, stored) is refused, so no caller can tell it from the one eager code builds."""
    import torch
    from ferrodyn.variables.nn_module import NNModuleVariable
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
    return NNModuleVariable(value=module)

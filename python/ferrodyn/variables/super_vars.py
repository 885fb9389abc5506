"""`super()` objects: `SuperVariable` owns attribute lookup through `super(cls, obj)` (zero-arg,
two-arg, in classmethods): the search starts after `cls` in type(obj)'s MRO; the class found is
reached as `type(obj).__mro__[i]` (its attribute guarded) and the classes skipped before it are
guarded not to define the name. Does not own the generic attribute lookup (user_objects.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ferrodyn.exc import BreakReason
from ferrodyn.source import AttrSource, DictOfSource, ItemSource, TypeSource
from ferrodyn.variables.base import VariableTracker, unsupported
from ferrodyn.variables.user_objects import ClassVariable, _lazy, _sub, class_attr_tracker


@dataclass(frozen=True, eq=False)
class SuperVariable(VariableTracker):
    """`super(cls, obj)`: attribute lookup starts after `cls` in type(obj)'s MRO."""

    cls: type = object
    obj: VariableTracker = None  # type: ignore[assignment]

    def describe(self):
        return f"super({self.cls.__name__})"

    def var_getattr(self, tx, name):
        obj = tx.realize(self.obj)
        if isinstance(obj, ClassVariable) and issubclass(obj.value, self.cls):
            owner, inst = obj.value, None  # super(cls, subclass): in classmethods
        else:
            owner, inst = obj.python_type(), obj
        mro = owner.__mro__
        if self.cls not in mro:
            unsupported(f"TypeError: super({self.cls.__name__}, obj): obj is not an instance "
                        f"or subtype", BreakReason.EXCEPTION)
        # the class found is reached as `type(obj).__mro__[i]`, so its attribute is guarded
        owner_src = obj.source if inst is None else (
            _sub(obj.source, TypeSource) or getattr(obj, "cls_source", None))
        mro_src = _sub(owner_src, lambda s: AttrSource(s, "__mro__"))
        for i, klass in enumerate(mro[mro.index(self.cls) + 1:], mro.index(self.cls) + 1):
            pending = tx.output.side_effects.pending_class_attr(klass, name)
            if pending is not None:
                return pending
            if name not in klass.__dict__:
                if mro_src is not None:  # found later: this class must still not define it
                    from ferrodyn.guard_spec import GuardKind
                    tx.output.install_guard(DictOfSource(ItemSource(mro_src, i)), GuardKind.DICT_LACKS,
                                            name)
                continue
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                from ferrodyn.variables import exceptions
                if name == "__init__" and klass.__module__ == "builtins" and \
                        isinstance(inst, exceptions.ExceptionVariable):
                    return exceptions.base_init(inst)  # BaseException's: sets args
                if attr is object.__init__ and inst is not None:
                    from ferrodyn.variables.builtins import NoOpFunction
                    return NoOpFunction(name="object.__init__")
                klass_src = _sub(mro_src, lambda s: ItemSource(s, i))
                if isinstance(attr, classmethod):  # bound to the class looked up from
                    from ferrodyn.variables.functions import BoundMethodVariable
                    cls_var = obj if inst is None else ClassVariable(
                        source=_sub(obj.source, TypeSource), value=owner)
                    func_src = _sub(klass_src, lambda s: AttrSource(AttrSource(s, name), "__func__"))
                    return BoundMethodVariable(func=_lazy(attr.__func__, func_src), obj=cls_var)
                return class_attr_tracker(tx, klass, klass_src, name, attr, inst)
        unsupported(f"AttributeError: super().{name}", BreakReason.EXCEPTION)

"""python/ferrodyn/_C.pyi (the Rust/Python contract) agrees with the built ferrodyn._C.

Every public name in the stub exists in the module with the same kind (class, function,
constant), every public member a stub class declares exists on the class, and every public name
the module exports is declared in the stub. Names deliberately not stubbed go in ALLOWLIST with
the reason.
"""

import ast
import inspect
import pathlib

import pytest

from ferrodyn import _C

STUB = pathlib.Path(_C.__file__).with_name("_C.pyi")
# name -> why it is exported but not part of the stub contract
ALLOWLIST: dict[str, str] = {}


def _stub_tree():
    return ast.parse(STUB.read_text())


def _stub_top_level():
    out = {}
    for node in _stub_tree().body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            out[node.name] = ("class", members)
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = ("function", set())
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = ("constant", set())
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = ("alias", set())
    return out


STUBBED = _stub_top_level()


@pytest.mark.parametrize("name", sorted(n for n in STUBBED if not n.startswith("_") and n != "Callback"))
def test_stubbed_name_exists_with_its_kind(name):
    kind, members = STUBBED[name]
    assert hasattr(_C, name), f"_C.pyi declares {name} but ferrodyn._C has no such name"
    obj = getattr(_C, name)
    if kind == "class":
        assert inspect.isclass(obj), f"{name} is a class in the stub, {type(obj)} in _C"
        missing = sorted(m for m in members if not m.startswith("__") and not hasattr(obj, m))
        dunder_missing = sorted(m for m in members if m.startswith("__") and m != "__init__"
                                and not hasattr(obj, m))
        assert not missing and not dunder_missing, f"{name} lacks {missing + dunder_missing}"
    elif kind == "function":
        assert callable(obj) and not inspect.isclass(obj), f"{name} should be a function"


def test_every_exported_name_is_stubbed():
    exported = {n for n in dir(_C) if not n.startswith("_")}
    undeclared = sorted(exported - set(STUBBED) - set(ALLOWLIST))
    assert not undeclared, f"ferrodyn._C exports names missing from _C.pyi: {undeclared}"

"""guards.compile_guards: GuardSpec lists -> GuardBuilder calls (recorded with a stand-in
builder, so the mapping is tested by itself) and -> real Rust GuardTrees (checked against
values that should pass and fail)."""

import pytest
import torch

from ferrodyn import _C
from ferrodyn.guard_spec import GuardKind, GuardSpec
from ferrodyn.guards import GuardCompileError, compile_guards
from ferrodyn.source import (AttrSource, BuiltinSource, ClosureSource, DictOfSource, GlobalSource,
                             ItemSource, LenSource, LocalSource, Source, TypeSource)


class RecordingBuilder:
    """Records every call; accessors return their call as the node."""

    def __init__(self, f_globals=None, f_builtins=None):
        self.calls = []
        self.globals = f_globals

    def __getattr__(self, name):
        def method(*args, **kwargs):
            call = (name, *args, *sorted(kwargs.items()))
            self.calls.append(call)
            return call
        return method

    def build(self):
        return self


def compile_recorded(specs):
    return compile_guards(specs, {}, {}, builder_factory=RecordingBuilder).calls


X = LocalSource(0, "x")


@pytest.mark.parametrize("source, first_calls", [
    (X, [("local", 0, "x")]),
    (GlobalSource("g"), [("global_", "g")]),
    (BuiltinSource("len"), [("builtin", "len")]),
    (ClosureSource(2, "c"), [("closure_cell", 2, "c")]),
    (AttrSource(X, "w"), [("local", 0, "x"), ("attr", ("local", 0, "x"), "w")]),
    (ItemSource(X, "k"), [("local", 0, "x"), ("item", ("local", 0, "x"), "k")]),
    (DictOfSource(X), [("local", 0, "x"), ("dict_of", ("local", 0, "x"))]),
    (TypeSource(X), [("local", 0, "x"), ("type_of", ("local", 0, "x"))]),
    (LenSource(X), [("local", 0, "x"), ("len_of", ("local", 0, "x"))]),
])
def test_each_source_maps_to_its_accessor(source, first_calls):
    calls = compile_recorded([GuardSpec.make(source, GuardKind.NOT_NONE)])
    assert calls[:-1] == first_calls
    assert calls[-1] == ("is_not_none", first_calls[-1])


T = torch.zeros(2)


@pytest.mark.parametrize("kind, payload, leaf", [
    (GuardKind.TYPE_MATCH, int, ("type_is", ("local", 0, "x"), int)),
    (GuardKind.ID_MATCH, T, ("is_", ("local", 0, "x"), T)),
    (GuardKind.NONE, None, ("is_none", ("local", 0, "x"))),
    (GuardKind.NOT_NONE, None, ("is_not_none", ("local", 0, "x"))),
    (GuardKind.EQUALS, 3, ("equals", ("local", 0, "x"), 3)),
    (GuardKind.LENGTH, 2, ("length_is", ("local", 0, "x"), 2)),
    (GuardKind.DICT_KEYS, ("a", "b"), ("dict_keys", ("local", 0, "x"), ["a", "b"])),
    (GuardKind.TENSOR_MATCH, T, ("tensor_match", ("local", 0, "x"), T, ("dynamic_dims", ()))),
])
def test_each_kind_maps_to_its_leaf(kind, payload, leaf):
    assert compile_recorded([GuardSpec.make(X, kind, payload)])[-1] == leaf


def test_global_state_has_no_source_and_specs_are_deduplicated():
    specs = [GuardSpec.make(None, GuardKind.GLOBAL_STATE), GuardSpec.make(X, GuardKind.EQUALS, 1),
             GuardSpec.make(None, GuardKind.GLOBAL_STATE), GuardSpec.make(X, GuardKind.EQUALS, 1)]
    calls = compile_recorded(specs)
    assert calls == [("global_state",), ("local", 0, "x"), ("equals", ("local", 0, "x"), 1)]


def test_shared_prefixes_make_one_accessor():
    mod = AttrSource(X, "m")
    calls = compile_recorded([GuardSpec.make(AttrSource(mod, "a"), GuardKind.EQUALS, 1),
                              GuardSpec.make(AttrSource(mod, "b"), GuardKind.EQUALS, 2)])
    assert [c[0] for c in calls].count("attr") == 3  # .m once, .a, .b
    assert [c[0] for c in calls].count("local") == 1


def test_unknown_source_is_a_clear_error():
    class Odd(Source):
        def name(self):
            return "odd"

    with pytest.raises(GuardCompileError, match="Odd"):
        compile_recorded([GuardSpec.make(Odd(), GuardKind.NOT_NONE)])


# ---- against the real Rust builder ---------------------------------------------------------

needs_rust_guards = pytest.mark.skipif(not hasattr(_C.GuardBuilder, "local"),
                                       reason="the Rust GuardBuilder is not built yet")

FLAG = True


@needs_rust_guards
def test_real_tree_passes_and_fails_like_the_specs_say():
    x = torch.randn(2, 3)
    specs = [GuardSpec.make(X, GuardKind.TENSOR_MATCH, x),
             GuardSpec.make(LocalSource(1, "n"), GuardKind.EQUALS, 4),
             GuardSpec.make(GlobalSource("FLAG"), GuardKind.EQUALS, True),
             GuardSpec.make(LenSource(LocalSource(2, "xs")), GuardKind.EQUALS, 2),
             GuardSpec.make(None, GuardKind.GLOBAL_STATE)]
    tree = compile_guards(specs, globals(), __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__))
    g = globals()
    assert tree.check((torch.randn(2, 3), 4, [1, 2]), g)
    assert not tree.check((torch.randn(2, 4), 4, [1, 2]), g)
    assert not tree.check((torch.randn(2, 3, dtype=torch.float64), 4, [1, 2]), g)
    assert not tree.check((torch.randn(2, 3), 5, [1, 2]), g)
    assert not tree.check((torch.randn(2, 3), 4, [1]), g)
    assert not tree.check((torch.randn(2, 3), 4, [1, 2]), {**g, "FLAG": False})
    with torch.no_grad():
        assert not tree.check((torch.randn(2, 3), 4, [1, 2]), g)
    assert "5" in tree.explain((torch.randn(2, 3), 5, [1, 2]), g)
    assert any("L['n']" in leaf for leaf in tree.leaves())

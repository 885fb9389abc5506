"""Every opcode of the running Python is handled by the translator or explicitly listed as
unsupported; handler names match opcodes; handlers carry version ranges and doc links."""

import dis
import sys

import pytest

import ferrodyn.symbolic  # noqa: F401  (registers the handlers)
from ferrodyn.exc import BreakReason, Unsupported
from ferrodyn.symbolic.opcodes_unsupported import UNSUPPORTED, refuse, unsupported_names
from ferrodyn.symbolic.registry import HANDLERS, SUPPORTED_VERSIONS, handled_names

VERSION = sys.version_info[:2]


def test_running_version_is_supported():
    assert VERSION in SUPPORTED_VERSIONS


def test_every_opcode_is_handled_or_listed_unsupported():
    handled, refused = handled_names(), unsupported_names()
    missing = sorted(set(dis.opmap) - handled - refused)
    assert not missing, f"opcodes neither handled nor listed unsupported: {missing}"


def test_no_opcode_is_both_handled_and_unsupported():
    assert not (handled_names() & unsupported_names())


def test_handler_names_are_opcodes_of_their_versions():
    for name, handlers in HANDLERS.items():
        for h in handlers:
            assert h.fn.__name__ == name
            assert h.since <= h.until
            if h.applies(VERSION):
                assert name in dis.opmap, f"{name} registered for {VERSION} but not an opcode"
            assert f"#opcode-{name}" in (h.fn.__doc__ or "")


def test_unsupported_entries_are_opcodes_of_their_versions():
    for name in unsupported_names():
        assert name in dis.opmap, name
    for name, r in UNSUPPORTED.items():
        assert isinstance(r.reason, BreakReason)


def test_refuse_raises_with_reason():
    class Inst:
        opname = "CHECK_EG_MATCH"
    with pytest.raises(Unsupported) as e:
        refuse(Inst)
    assert e.value.reason is BreakReason.EXCEPTION

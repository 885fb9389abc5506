"""ferrodyn/_platform.py: importing on an unsupported CPython minor fails clearly."""

import sys

import pytest

from ferrodyn._platform import SUPPORTED_MINORS, check_python_version


@pytest.mark.parametrize("minor", [(3, 10), (3, 13), (2, 7)])
def test_unsupported_minor_is_refused(minor):
    with pytest.raises(ImportError, match=r"supports CPython 3\.11, 3\.12; this is CPython " +
                       rf"{minor[0]}\.{minor[1]}"):
        check_python_version((*minor, 0, "final", 0))


def test_this_interpreter_is_supported():
    assert tuple(sys.version_info[:2]) in SUPPORTED_MINORS
    check_python_version()


def test_extension_built_for_this_minor():
    from ferrodyn import _C
    assert _C.PYTHON_BUILT_FOR == tuple(sys.version_info[:2])

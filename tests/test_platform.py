"""ferrodyn/_platform.py: importing on an unsupported CPython minor, or on a free-threaded
(`--disable-gil`) build, fails clearly; the supported minors import and match the extension."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ferrodyn import _platform
from ferrodyn._platform import SUPPORTED_MINORS, check_gil_build, check_python_version

SRC = Path(__file__).resolve().parents[1] / "python"


@pytest.mark.parametrize("minor", [(3, 10), (3, 14), (2, 7)])
def test_unsupported_minor_is_refused(minor):
    with pytest.raises(ImportError, match=r"supports CPython 3\.11, 3\.12, 3\.13; this is "
                       rf"CPython {minor[0]}\.{minor[1]}"):
        check_python_version((*minor, 0, "final", 0))


@pytest.mark.parametrize("minor", [(3, 11), (3, 12), (3, 13)])
def test_supported_minors_pass(minor):
    check_python_version((*minor, 0, "final", 0))


def test_this_interpreter_is_supported():
    assert tuple(sys.version_info[:2]) in SUPPORTED_MINORS
    check_python_version()
    assert not _platform.is_free_threaded_build()
    check_gil_build()


def test_extension_built_for_this_minor():
    from ferrodyn import _C
    assert _C.PYTHON_BUILT_FOR == tuple(sys.version_info[:2])


def test_free_threaded_build_is_refused_by_the_check():
    with pytest.raises(ImportError, match=r"does not support free-threaded CPython builds"):
        check_gil_build(free_threaded=True)
    check_gil_build(free_threaded=False)


def test_import_on_a_free_threaded_build_fails_before_loading_the_extension():
    """`import ferrodyn` (the real entry point) on an interpreter whose build check says
    free-threaded: ImportError naming the problem, and the native module never loaded."""
    script = textwrap.dedent("""
        import importlib.util, sys
        # Load ferrodyn/_platform.py on its own (importing it normally would run the package
        # first), patch the build check, then import the package for real.
        spec = importlib.util.spec_from_file_location("ferrodyn._platform", sys.argv[1])
        p = sys.modules["ferrodyn._platform"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(p)
        p.is_free_threaded_build = lambda: True
        try:
            import ferrodyn
        except ImportError as e:
            print("refused:", e)
        else:
            print("imported")
        print("native loaded:", "ferrodyn._C" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(SRC / "ferrodyn" / "_platform.py")], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "refused: ferrodyn does not support free-threaded CPython builds" in proc.stdout
    assert "native loaded: False" in proc.stdout

"""Owns the supported-platform check that runs before the native module is imported: the
CPython minor (3.11, 3.12, 3.13) and the build flavour (free-threaded builds are refused).

Does not own anything else: it must stay importable on any CPython so the error is clear.
"""

import sys
import sysconfig

SUPPORTED_MINORS = ((3, 11), (3, 12), (3, 13))


def check_python_version(version_info=sys.version_info) -> None:
    """Raise ImportError naming the supported versions when this CPython minor is not one."""
    minor = tuple(version_info[:2])
    if minor not in SUPPORTED_MINORS:
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_MINORS)
        raise ImportError(
            f"ferrodyn supports CPython {supported}; this is CPython "
            f"{minor[0]}.{minor[1]} ({sys.executable}). Install ferrodyn under a supported version."
        )


def is_free_threaded_build() -> bool:
    """Whether this interpreter was built with `--disable-gil` (PEP 703, e.g. `python3.13t`),
    whether or not the GIL happens to be enabled at run time."""
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def check_gil_build(free_threaded=None) -> None:
    """Raise ImportError on a free-threaded build: the frame hook, the guards' raw reads and the
    weak dictionaries rely on the GIL serialising every access."""
    if free_threaded is None:
        free_threaded = is_free_threaded_build()
    if free_threaded:
        raise ImportError(
            "ferrodyn does not support free-threaded CPython builds (PEP 703, 'python3.13t'); "
            f"this is one ({sys.executable}). Use the default (GIL) build of CPython "
            + ", ".join(f"{a}.{b}" for a, b in SUPPORTED_MINORS) + "."
        )


def check_platform() -> None:
    """Every check, in the order a user would want them reported."""
    check_python_version()
    check_gil_build()

"""Owns the supported-platform check that runs before the native module is imported.

Does not own anything else: it must stay importable on any CPython so the error is clear.
"""

import sys

SUPPORTED_MINORS = ((3, 11), (3, 12))


def check_python_version(version_info=sys.version_info) -> None:
    """Raise ImportError naming the supported versions when this CPython minor is not one."""
    minor = tuple(version_info[:2])
    if minor not in SUPPORTED_MINORS:
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_MINORS)
        raise ImportError(
            f"ferrodyn supports CPython {supported}; this is CPython "
            f"{minor[0]}.{minor[1]} ({sys.executable}). Install ferrodyn under a supported version."
        )

"""ferrodyn: TorchDynamo-style graph capture with a Rust hot path.

This module owns the public namespace only (re-exports); each name lives in its own module.
"""

from ferrodyn._platform import check_python_version as _check_python_version

_check_python_version()

from ferrodyn import _C  # noqa: E402  (after the version check, on purpose)

__all__ = ["_C"]

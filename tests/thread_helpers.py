"""Running test workers on several threads with a tiny GIL switch interval, so that threads
interleave inside the operations under test (the weak-dictionary thread tests share it)."""

from __future__ import annotations

import sys
import threading
from typing import Callable, Iterable


def run_interleaved(targets: Iterable[Callable[[], None]]) -> None:
    """Start one thread per target with the switch interval at 10 µs, wait for all of them,
    and restore the interval. Workers report their own failures (e.g. into a list)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=t) for t in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)

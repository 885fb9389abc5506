"""Debug logging through the standard `logging` module.

Owns the ferrodyn loggers and the `FERRODYN_LOGS` switch. Channels (each a child of the
"ferrodyn" logger):

    graph       the captured fx graph of each compiled frame (and the generated entry source)
    guards      the guard expressions installed for each compiled frame
    recompiles  why a frame was compiled again: the first failing guard of each cached entry
    eager       why a frame runs eagerly (the Unsupported message)
    dynamic     automatic dynamic: which source and dim became symbolic, and why
    graph_breaks  each graph break that resumes, once per (code, instruction): the reason and
                the user's stack (file:line of each inlined frame, innermost last)

`FERRODYN_LOGS=graph,guards,recompiles` (or `all`) at import, or `set_logs("graph,eager")` later,
sets those channels to DEBUG and attaches one stderr handler to "ferrodyn". Records are emitted
only on the compile path, never per call.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable

CHANNELS = ("graph", "guards", "recompiles", "eager", "dynamic", "graph_breaks")

root = logging.getLogger("ferrodyn")
graph_log = logging.getLogger("ferrodyn.graph")
guards_log = logging.getLogger("ferrodyn.guards")
recompiles_log = logging.getLogger("ferrodyn.recompiles")
eager_log = logging.getLogger("ferrodyn.eager")
dynamic_log = logging.getLogger("ferrodyn.dynamic")
graph_breaks_log = logging.getLogger("ferrodyn.graph_breaks")

_handler: logging.Handler | None = None


def parse(spec: str | Iterable[str]) -> list[str]:
    """`"graph,guards"` / `"all"` / an iterable of names -> channel names; unknown names raise."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    names = [n for n in names if n]
    if "all" in names:
        return list(CHANNELS)
    bad = [n for n in names if n not in CHANNELS]
    if bad:
        raise ValueError(f"unknown ferrodyn log channel(s) {bad}; known: {', '.join(CHANNELS)}, all")
    return names


def set_logs(spec: str | Iterable[str] = "", *, handler: bool = True) -> list[str]:
    """Enable exactly these channels at DEBUG (the others go back to NOTSET). With `handler`,
    attach one stderr handler to the "ferrodyn" logger (once). Returns the enabled channels."""
    global _handler
    names = parse(spec)
    for ch in CHANNELS:
        logging.getLogger(f"ferrodyn.{ch}").setLevel(logging.DEBUG if ch in names else logging.NOTSET)
    if names and handler and _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        root.addHandler(_handler)
    return names


def configure_from_env(environ=os.environ) -> list[str]:
    """Apply `FERRODYN_LOGS` from `environ` (no-op when unset or empty)."""
    spec = environ.get("FERRODYN_LOGS", "")
    return set_logs(spec) if spec.strip() else []


configure_from_env()

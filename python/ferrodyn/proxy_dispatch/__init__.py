"""Proxy-mode dispatch: `make_fx` traces a function into an aten-level torch.fx graph.

Owns the public names of the package: `make_fx` (make_fx.py), the dispatch mode (mode.py) and
the tracker (tracker.py); the `aten_eager` backend lives in backend.py and is imported on
demand (importing it registers it with torch's backend registry).
"""

from ferrodyn.proxy_dispatch.make_fx import last_trace, make_fx
from ferrodyn.proxy_dispatch.mode import ProxyDispatchMode
from ferrodyn.proxy_dispatch.tracker import ProxyTracker

__all__ = ["make_fx", "last_trace", "ProxyDispatchMode", "ProxyTracker"]

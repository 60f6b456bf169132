"""The worker's health, answered by the worker itself without a broker round trip: liveness
from its main loop's progress, readiness with a reason, the stall watchdog, and what serves them
(the probe listener, the state file the ``workerctl health`` exec probe reads, systemd's
``sd_notify``).

Public for plugins: :class:`Health` (``worker.health``: hold a readiness reason of your own with
``worker.health.hold(reason)`` and release it after), the reason words, :func:`probe_app` and
:func:`probe_response` to answer the probe paths on a listener of your own, and :func:`serve`,
:class:`ListenerSecurity`, :func:`listener_security` and :func:`parse_listen` to open an HTTP
listener with the worker's TLS and authentication options.

Names are imported when first asked for: the exec probe imports :mod:`.probe` alone.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .addresses import address_of, parse_listen
    from .listener import Listener, serve
    from .plugin import listener_security
    from .probes import PROBE_PATHS, probe_app, probe_response
    from .security import ListenerSecurity
    from .state import (
        BOOTING,
        BROKER_BLOCKED,
        BROKER_DISCONNECTED,
        CONSUMER_STALLED,
        DRAINING,
        LIVE,
        READINESS_ORDER,
        SERVING,
        STARTING,
        STUCK,
        Health,
        Verdict,
    )

__all__ = [
    "BOOTING",
    "BROKER_BLOCKED",
    "BROKER_DISCONNECTED",
    "CONSUMER_STALLED",
    "DRAINING",
    "LIVE",
    "PROBE_PATHS",
    "READINESS_ORDER",
    "SERVING",
    "STARTING",
    "STUCK",
    "Health",
    "Listener",
    "ListenerSecurity",
    "Verdict",
    "address_of",
    "listener_security",
    "parse_listen",
    "probe_app",
    "probe_response",
    "serve",
]

_HOME = {
    **dict.fromkeys(("BOOTING", "BROKER_BLOCKED", "BROKER_DISCONNECTED", "CONSUMER_STALLED", "DRAINING",
                     "LIVE", "READINESS_ORDER", "SERVING", "STARTING", "STUCK", "Health", "Verdict"),
                    "state"),
    **dict.fromkeys(("Listener", "serve"), "listener"),
    **dict.fromkeys(("address_of", "parse_listen"), "addresses"),
    "ListenerSecurity": "security",
    **dict.fromkeys(("PROBE_PATHS", "probe_app", "probe_response"), "probes"),
    "listener_security": "plugin",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'worker_core.health' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

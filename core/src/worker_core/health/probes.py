"""The probes over HTTP: a WSGI app answering ``/livez``, ``/readyz`` and ``/startupz`` from the
worker's :class:`~.state.Health`, with the reason as the body (``200 serving``, ``503
broker-disconnected for 4s``). Served on ``--health-listen``, and by plugins that serve HTTP
anyway (the metrics listener) next to their own paths."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import Health, Verdict

__all__ = ["PROBE_PATHS", "WSGIApp", "probe_app", "probe_response"]

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: the probe paths, each with the check it answers (``/healthz`` is the liveness of old habits)
PROBE_PATHS = {"/livez": "live", "/healthz": "live", "/readyz": "ready", "/startupz": "started"}


def probe_response(health: Health, path: str) -> tuple[str, bytes] | None:
    """The status line and body for a probe ``path``, or ``None`` when ``path`` is not one."""
    check = PROBE_PATHS.get(path.rstrip("/") or path)
    if check is None:
        return None
    verdict: Verdict = getattr(health, check)()
    status = "200 OK" if verdict.ok else "503 Service Unavailable"
    return status, f"{verdict.line()}\n".encode()


def probe_app(health: Health, fallback: WSGIApp | None = None) -> WSGIApp:
    """A WSGI app answering the probe paths from ``health``, and any other path with
    ``fallback`` (404 without one)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        answer = probe_response(health, environ.get("PATH_INFO", ""))
        if answer is None:
            if fallback is not None:
                return fallback(environ, start_response)
            paths = ", ".join(PROBE_PATHS)
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not a probe path; this listener answers {paths}\n".encode()]
        status, body = answer
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store"),
                                ("Content-Length", str(len(body)))])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    return app

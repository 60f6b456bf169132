"""The worker's HTTP listener: a small threaded WSGI server for the probes (``--health-listen``)
and for plugins that serve HTTP (the metrics), with TLS and basic authentication when asked.

- **TLS** (``--http-certfile``/``--http-keyfile``, as prometheus_client's ``start_http_server``
  takes them): Python's ``ssl``, TLS 1.2 or later; ``--http-client-cafile`` also requires every
  client to show a certificate that CA signed. The handshake runs in the connection's own thread
  with a timeout, so a client that stalls in it holds up no other.
- **Basic authentication** (``--http-user``/``--http-password``): every path but the probes'
  asks for it (a kubelet cannot read a Secret into a probe's headers, and a probe tells only
  ready or not and a reason word).

The listening socket is closed in any process forked after it opened (prefork children), so
none holds the port once the worker is gone.
"""

from __future__ import annotations

import os
import socket
import socketserver
import ssl
import threading
import weakref
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from ..exceptions import ConfigurationError
from .addresses import address_of
from .probes import WSGIApp
from .security import ListenerSecurity

__all__ = ["Listener", "serve"]

#: seconds a client may take for the TLS handshake, and then for each read or write
CLIENT_TIMEOUT = 10.0


class _Handler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT  # a client that stops mid-request frees its thread

    def log_message(self, format: str, *args: Any) -> None:
        """Probes and scrapes come every few seconds: no line each."""


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], family: int, context: ssl.SSLContext | None) -> None:
        self.address_family = family
        self._context = context
        super().__init__(address, _Handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        if self._context is not None:
            request.settimeout(CLIENT_TIMEOUT)
            try:
                request = self._context.wrap_socket(request, server_side=True)
            except (OSError, ValueError):  # a failed handshake: a plain-HTTP client, a bad certificate
                self.shutdown_request(request)
                return
        super().process_request_thread(request, client_address)


_open: weakref.WeakSet[_Server] = weakref.WeakSet()


def _close_in_child() -> None:
    for server in list(_open):
        try:
            server.socket.close()
        except OSError:
            pass
    _open.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class Listener:
    """An HTTP listener serving a WSGI app from a thread of its own; :meth:`close` ends it."""

    def __init__(self, server: _Server, security: ListenerSecurity) -> None:
        self._server = server
        self.security = security
        self.host = str(server.server_address[0])
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="worker-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return address_of(self.host, self.port, self.security.scheme)

    def close(self) -> None:
        """Stop serving and free the port (once; again does nothing)."""
        server = self.__dict__.pop("_server", None)
        if server is None:
            return
        server.shutdown()
        server.server_close()
        _open.discard(server)


def serve(host: str, port: int, app: WSGIApp, security: ListenerSecurity | None = None,
          option: str = "--health-listen") -> Listener:
    """Listen on ``host:port`` (port 0: a free one) and serve ``app`` behind ``security``.

    :raise ConfigurationError: naming ``option`` when the address cannot be listened on, or
        when a TLS file cannot be loaded.
    """
    security = security or ListenerSecurity()
    context = security.ssl_context()
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        server = _Server((str(sockaddr[0]), port), family, context)
    except OSError as exc:
        raise ConfigurationError(f"{option} {shown}: cannot listen there ({exc.strerror or exc}); choose "
                                 f"a free port, or an address of this machine") from None
    server.set_app(security.guard(app))
    _open.add(server)
    return Listener(server, security)

"""How the worker's HTTP listeners protect themselves: TLS (with client certificates when asked)
and basic authentication, from the ``--http-*`` options of the health plugin."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs

from ..exceptions import ConfigurationError
from .probes import PROBE_PATHS, WSGIApp

if TYPE_CHECKING:
    import ssl

__all__ = ["ListenerSecurity"]


@attrs.frozen
class ListenerSecurity:
    """How an HTTP listener of the worker protects itself: TLS, client certificates, basic
    authentication. The default is plain HTTP, open to anyone who can reach the port."""

    certfile: str | None = None
    keyfile: str | None = None
    client_cafile: str | None = None
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    #: paths answered without credentials
    open_paths: frozenset[str] = frozenset(PROBE_PATHS)

    @property
    def tls(self) -> bool:
        return self.certfile is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context, or ``None`` for plain HTTP.

        :raise ConfigurationError: a certificate, key or CA file that cannot be loaded.
        """
        if self.certfile is None:
            return None
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.certfile, self.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"--http-certfile {self.certfile!r} / --http-keyfile {self.keyfile!r}: cannot load the "
                f"certificate and its key ({exc}); give a PEM certificate and its private key") from None
        if self.client_cafile is not None:
            try:
                context.load_verify_locations(self.client_cafile)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(f"--http-client-cafile {self.client_cafile!r}: cannot load it "
                                         f"({exc}); give the PEM file of the CA that signs client "
                                         f"certificates") from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def guard(self, app: WSGIApp) -> WSGIApp:
        """``app`` behind basic authentication, when a user is configured."""
        if self.username is None:
            return app
        expected = "Basic " + base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
        open_paths = self.open_paths

        def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path in open_paths or path.rstrip("/") in open_paths:
                return app(environ, start_response)
            given = environ.get("HTTP_AUTHORIZATION", "")
            if hmac.compare_digest(given.encode(), expected.encode()):
                return app(environ, start_response)
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="worker"'),
                                                ("Content-Type", "text/plain; charset=utf-8")])
            return [b"this listener needs a user name and password (basic authentication)\n"]

        return guarded

"""Cluster URLs: ``redis-cluster://[user:password@]host:port[,host:port...][/]`` and the TLS form
``rediss-cluster://``, checked once, with errors naming what is wrong and a correct example.

Every node named is a seed: the client asks the first one that answers for the cluster's slots and
finds the other nodes from there, so one live node is enough to start.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote

import attrs

from worker_core.exceptions import ConfigurationError
from worker_core.redaction import redact_url

__all__ = ["EXAMPLE", "SCHEMES", "ClusterUrl", "parse_url"]

SCHEMES = ("redis-cluster", "rediss-cluster")
EXAMPLE = "redis-cluster://:password@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379/"
_TLS_EXAMPLE = (
    "rediss-cluster://10.0.0.1:6379,10.0.0.2:6379/?ssl_cert_reqs=required&ssl_ca_certs=/etc/ssl/ca.pem"
)
DEFAULT_PORT = 6379


@attrs.frozen
class ClusterUrl:
    """What a cluster URL says: the seed nodes, the credentials, TLS, and its ``ssl_*`` query."""

    scheme: str
    seeds: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    #: the ``ssl_*`` parameters of the query, as text (checked with the other TLS arguments)
    tls_query: tuple[tuple[str, str], ...] = ()

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss-cluster"


def _bad(url: str, why: str) -> ConfigurationError:
    example = _TLS_EXAMPLE if url.lower().startswith("rediss") else EXAMPLE
    return ConfigurationError(f"broker URL {redact_url(url)!r} {why}; for example {example}")


def _seed(url: str, text: str) -> tuple[str, int]:
    if text.startswith("["):  # [ipv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise _bad(url, f"has a malformed node {text!r}")
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise _bad(url, f"has a node without a host ({text!r})")
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _bad(url, f"has node {text!r} whose port is not a number from 1 to 65535")
    return host, int(port_text)


def parse_url(url: str) -> ClusterUrl:
    """Check a cluster URL; bad ones raise ConfigurationError."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"a Redis Cluster URL is scheme://node,node/ (got {url!r}); for example {EXAMPLE}"
        )
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in SCHEMES:
        raise _bad(url, f"is not a Redis Cluster URL: the scheme must be one of {', '.join(SCHEMES)}")
    if ";" in url:
        raise _bad(
            url,
            "lists several URLs with ';': a cluster URL lists its nodes with ',' in one URL (the client "
            "finds every node from any one of them)",
        )
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise _bad(url, f"names database {path.strip('/')!r}: a Redis Cluster has database 0 only")
    userinfo, _, hosts = netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, _, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if secret else None
    if not hosts:
        raise _bad(url, "names no node")
    seeds = tuple(_seed(url, part.strip()) for part in hosts.split(",") if part.strip())
    if not seeds:
        raise _bad(url, "names no node")
    parameters = parse_qsl(query, keep_blank_values=True)
    unknown = [name for name, _ in parameters if not name.startswith("ssl_")]
    if unknown:
        raise _bad(
            url,
            f"has query parameters {', '.join(unknown)} that this transport does not read (only ssl_* TLS "
            f"arguments; other options go in broker_transport_options)",
        )
    tls_query = tuple(parameters)
    if tls_query and scheme.lower() != "rediss-cluster":
        raise _bad(
            url,
            f"gives TLS arguments ({', '.join(name for name, _ in tls_query)}) in a redis-cluster:// URL: "
            f"write rediss-cluster:// for TLS",
        )
    return ClusterUrl(scheme.lower(), seeds, username, password, tls_query)

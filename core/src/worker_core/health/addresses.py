"""Listen addresses as operators write them (``9808``, ``127.0.0.1:9808``, ``[::1]:9808``) and
the URLs of what listens there."""

from __future__ import annotations

import ipaddress

__all__ = ["address_of", "parse_listen"]


def parse_listen(text: str) -> tuple[str, int]:
    """``PORT``, ``:PORT``, ``HOST:PORT`` or ``[IPv6]:PORT`` as ``(host, port)``; without a host,
    every IPv4 address (``0.0.0.0``), as exporters listen for the Prometheus server or the kubelet
    to reach them. Port 0 takes a free port (the log line says which)."""
    text = text.strip()
    host, _, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address (got {text!r})") from None
    elif ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, as [::1]:9808 (got {text!r})")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(
            f"must be PORT or HOST:PORT, for example 9808 or 127.0.0.1:9808 (got {text!r})") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"the port must be from 0 to 65535 (got {text!r})")
    return host or "0.0.0.0", port


def address_of(host: str, port: int, scheme: str = "http") -> str:
    """``http://127.0.0.1:9808``, ``https://[::1]:9808``."""
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"

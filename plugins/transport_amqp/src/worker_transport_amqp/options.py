"""Broker URLs and ``broker_transport_options`` for the AMQP transport, checked once, with errors
that name the option, what was given and a correct example.

kombu hands every transport option to ``amqp.Connection``; the names it accepts, and those
``kombu.Connection`` itself reads (the reconnect schedule), are allowed, anything else refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.redaction import redact_url, redact_value

__all__ = ["SCHEMES", "check_options", "check_urls"]

SCHEMES = ("amqp", "amqps", "pyamqp")
_EXAMPLE = "amqp://guest:guest@127.0.0.1:5672//"
_TLS_EXAMPLE = "amqps://user:password@rabbit.example.com:5671/vhost"

#: ``amqp.Connection`` arguments (the ones not set from the URL or the worker's settings).
_AMQP = frozenset({
    "login_method", "login_response", "authentication", "locale", "client_properties", "channel_max",
    "frame_max", "on_open", "on_blocked", "on_unblocked", "confirm_publish", "on_tune_ok",
    "read_timeout", "write_timeout", "socket_settings",
})
#: Read by kombu.Connection and the worker's connector (reconnect schedule).
_KOMBU = frozenset({"max_retries", "interval_start", "interval_step", "interval_max",
                    "connect_retries_timeout", "errback"})
KNOWN = frozenset({*_AMQP, *_KOMBU, "ssl"})
_NUMBERS = ("read_timeout", "write_timeout")


def check_urls(url: str) -> tuple[str, list[str]]:
    """The scheme and the ``;``-separated URLs of ``url``, each checked."""
    parts = [part.strip() for part in url.split(";") if part.strip()]
    if not parts:
        raise ConfigurationError(f"empty AMQP broker URL; write it as {_EXAMPLE}")
    scheme = parts[0].partition("://")[0].lower()
    for part in parts:
        given, sep, _ = part.partition("://")
        if not sep or given.lower() not in SCHEMES:
            raise ConfigurationError(
                f"broker URL {redact_url(part)!r} is not an AMQP URL: the scheme must be one of "
                f"{', '.join(SCHEMES)}; for example {_EXAMPLE} (or {_TLS_EXAMPLE} for TLS)"
            )
        try:
            port = urlsplit(part).port
        except ValueError as exc:
            raise ConfigurationError(
                f"broker URL {redact_url(part)!r} is malformed ({exc}); for example {_EXAMPLE}"
            ) from None
        if port is not None and not 0 < port < 65536:
            raise ConfigurationError(f"broker URL {redact_url(part)!r} has port {port}, outside 1-65535; "
                                     f"for example {_EXAMPLE}")
    return scheme, parts


def check_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given``, checked: unknown names and values of the wrong type raise ConfigurationError."""
    for name, value in given.items():
        if name not in KNOWN:
            raise ConfigurationError(
                f"unknown broker transport option {name!r} for the AMQP transport."
                f"{did_you_mean(name, KNOWN)} It reads py-amqp's connection arguments and kombu's: "
                f"{', '.join(sorted(KNOWN))}"
            )
        if name in _NUMBERS and value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
        ):
            raise _bad(name, value, "a number of seconds greater than 0, or None", 30)
        if name == "confirm_publish" and not isinstance(value, bool):
            raise _bad(name, value, "True or False", True)
        if name == "client_properties" and not isinstance(value, Mapping):
            raise _bad(name, value, "a mapping", {"connection_name": "worker@host"})
        if name == "ssl" and not isinstance(value, (bool, Mapping)):
            # the arguments themselves are checked with broker_use_ssl (see .tls)
            raise _bad(name, value, "True, False or a mapping of py-amqp SSL arguments",
                       {"ca_certs": "/etc/ssl/certs/ca.pem"})
    return dict(given)


def _bad(name: str, value: Any, expected: str, example: Any) -> ConfigurationError:
    return ConfigurationError(
        f"broker transport option {name!r} must be {expected} (got {redact_value(name, value)!r} that is a "
        f"{type(value).__name__}); for example broker_transport_options={{{name!r}: {example!r}}}"
    )

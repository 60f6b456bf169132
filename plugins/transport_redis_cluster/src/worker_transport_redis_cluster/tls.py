"""TLS to the cluster's nodes: redis-py's SSL arguments from the URL's query (``rediss-cluster://``),
``broker_use_ssl`` (``redis_backend_use_ssl`` for results) or the transport option ``ssl``, gathered
and checked once. The nodes' certificates are verified unless the configuration says otherwise in
so many words, and the same arguments serve every node the client finds."""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.redaction import redact_url, redact_value

from .urls import ClusterUrl

__all__ = ["ARGUMENTS", "resolve_tls"]

logger = logging.getLogger(__name__)

_CA = "/etc/ssl/certs/ca.pem"
_CERT_REQS = {
    "required": "required",
    "optional": "optional",
    "none": "none",
    "CERT_REQUIRED": "required",
    "CERT_OPTIONAL": "optional",
    "CERT_NONE": "none",
}
_BY_MODE: dict[int, str] = {
    ssl.CERT_REQUIRED: "required",
    ssl.CERT_OPTIONAL: "optional",
    ssl.CERT_NONE: "none",
}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _cert_reqs(value: Any, from_url: bool) -> str | None:
    if isinstance(value, str) and value in _CERT_REQS:
        return _CERT_REQS[value]
    if not from_url and isinstance(value, int) and not isinstance(value, bool) and value in _BY_MODE:
        return _BY_MODE[value]
    return None


def _flag(value: Any, from_url: bool) -> bool | None:
    if isinstance(value, bool):
        return value
    if from_url and isinstance(value, str) and value.lower() in (*_TRUE, *_FALSE):
        return value.lower() in _TRUE
    return None


def _file(value: Any, from_url: bool) -> str | None:
    if isinstance(value, (str, os.PathLike)) and os.path.isfile(value) and os.access(value, os.R_OK):
        return str(os.fspath(value))
    return None


def _directory(value: Any, from_url: bool) -> str | None:
    if isinstance(value, (str, os.PathLike)) and os.path.isdir(value):
        return str(os.fspath(value))
    return None


def _text(value: Any, from_url: bool) -> str | None:
    return value if isinstance(value, str) and value else None


#: The SSL arguments taken, each with its check (None: the value does not fit), what it must
#: be, and an example.
ARGUMENTS: Mapping[str, tuple[Callable[[Any, bool], Any], str, Any]] = {
    "ssl_cert_reqs": (_cert_reqs, "one of 'required', 'optional', 'none' (or ssl.CERT_*)", "required"),
    "ssl_check_hostname": (_flag, "True or False", True),
    "ssl_ca_certs": (_file, "the path of a readable file", _CA),
    "ssl_ca_path": (_directory, "the path of a directory", "/etc/ssl/certs"),
    "ssl_certfile": (_file, "the path of a readable file", "/etc/ssl/client.pem"),
    "ssl_keyfile": (_file, "the path of a readable file", "/etc/ssl/client.key"),
    "ssl_password": (_text, "a non-empty string", "the key's password"),
    "ssl_ciphers": (_text, "a non-empty string", "ECDHE+AESGCM"),
}


def _checked(name: str, value: Any, where: str, from_url: bool) -> Any:
    if name not in ARGUMENTS:
        hint = f" Did you mean 'ssl_{name}'?" if f"ssl_{name}" in ARGUMENTS else did_you_mean(name, ARGUMENTS)
        raise ConfigurationError(
            f"unknown TLS argument {name!r} in {where}.{hint} It takes {', '.join(ARGUMENTS)}"
        )
    check, expected, example = ARGUMENTS[name]
    checked = check(value, from_url)
    if checked is None:
        raise ConfigurationError(
            f"TLS argument {name!r} in {where} must be {expected} (got {redact_value(name, value)!r} that is "
            f"a {type(value).__name__}); for example {where}={{{name!r}: {example!r}}}"
        )
    return checked


def resolve_tls(
    url: str, parsed: ClusterUrl, given: tuple[tuple[str, Any], ...], role: str
) -> dict[str, Any] | None:
    """redis-py's SSL arguments for the cluster (None: plain TCP). ``given`` holds the settings that
    may turn TLS on, as ``(name, value)`` (a mapping, True, or nothing); two that both give
    arguments must agree."""
    chosen = [(where, value) for where, value in given if value]
    if len(chosen) > 1 and any(value != chosen[0][1] for _, value in chosen[1:]):
        (first, _), (second, _) = chosen[:2]
        raise ConfigurationError(
            f"{first} and {second} both give TLS arguments for the {role}, and they differ: set only one of "
            f"them"
        )
    arguments: dict[str, Any] = {}
    if chosen:
        where, value = chosen[0]
        if value is not True:
            if not isinstance(value, Mapping):
                raise ConfigurationError(
                    f"{where} must be True or a mapping of redis-py SSL arguments (got "
                    f"{redact_value('ssl', value)!r} that is a {type(value).__name__}); for example "
                    f"{where}={{'ssl_cert_reqs': 'required', 'ssl_ca_certs': '{_CA}'}}"
                )
            arguments = {name: _checked(name, item, where, False) for name, item in value.items()}
    for name, text in parsed.tls_query:
        found = _checked(name, text, "the URL", True)
        if name in arguments and arguments[name] != found:
            raise ConfigurationError(
                f"TLS argument {name} is {redact_value(name, text)!r} in the URL but "
                f"{redact_value(name, arguments[name])!r} in {chosen[0][0]}: give it in one place"
            )
        arguments[name] = found
    if not parsed.tls and not chosen:
        return None
    shown = redact_url(url)
    if "ssl_cert_reqs" not in arguments:
        raise ConfigurationError(
            f"the {role} at {shown} uses TLS but ssl_cert_reqs is not set, so nothing says whether the "
            f"nodes' certificates are verified: set ssl_cert_reqs='required' and the CA that signed them, "
            f"for example rediss-cluster://10.0.0.1:6379/?ssl_cert_reqs=required&ssl_ca_certs={_CA}; "
            f"ssl_cert_reqs='none' encrypts without verifying (not recommended)"
        )
    if arguments["ssl_cert_reqs"] == "none":
        if arguments.get("ssl_check_hostname") is True:
            raise ConfigurationError(
                f"the {role} at {shown} has ssl_check_hostname=True but ssl_cert_reqs='none': a host name is "
                f"checked only on a verified certificate"
            )
        arguments["ssl_check_hostname"] = False
        _warn_once(
            f"TLS to the {role} at {shown} does not verify the nodes' certificates (ssl_cert_reqs='none'): "
            f"whoever answers at their addresses is trusted"
        )
    else:
        arguments.setdefault("ssl_check_hostname", True)
    return arguments


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)

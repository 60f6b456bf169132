"""TLS for the AMQP broker: py-amqp's SSL arguments from ``broker_use_ssl`` or the ``ssl``
transport option, checked once. The server's certificate is verified, and its host name checked
against the URL's, unless the configuration turns either off in so many words."""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import attrs

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.redaction import redact_url, redact_value

__all__ = ["TLS", "broker_tls"]

logger = logging.getLogger(__name__)

_CA = "/etc/ssl/certs/ca.pem"
#: Celery's spellings of a certificate requirement, and the ``ssl.CERT_*`` values themselves
_CERT_REQS: Mapping[Any, ssl.VerifyMode] = {
    "required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE,
    "CERT_REQUIRED": ssl.CERT_REQUIRED, "CERT_OPTIONAL": ssl.CERT_OPTIONAL, "CERT_NONE": ssl.CERT_NONE,
}


class _Invalid(Exception):
    """A value that does not fit its argument: what was expected instead, and why not if the
    kind of value was right."""

    def __init__(self, expected: str, reason: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.reason = reason


def _cert_reqs(value: Any) -> ssl.VerifyMode:
    if isinstance(value, str) and value in _CERT_REQS:
        return _CERT_REQS[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in set(ssl.VerifyMode):
        return ssl.VerifyMode(value)
    raise _Invalid(f"ssl.CERT_REQUIRED, ssl.CERT_OPTIONAL or ssl.CERT_NONE, or one of "
                   f"{', '.join(map(repr, _CERT_REQS))}")


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("True or False")
    return value


def _file(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise _Invalid("the path of a file")
    path = str(os.fspath(value))
    # Checked now: at connection time a missing file is one more "cannot connect" retry line.
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise _Invalid("the path of a readable file", "there is no readable file there")
    return path


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid("a non-empty string")
    return value


def _tls_version(value: Any) -> ssl.TLSVersion:
    if isinstance(value, ssl.TLSVersion):
        return value
    if isinstance(value, str) and value in ssl.TLSVersion.__members__:
        return ssl.TLSVersion[value]
    raise _Invalid("an ssl.TLSVersion, or its name (TLSv1_2, TLSv1_3, ...)")


def _protocol(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _Invalid("an ssl.PROTOCOL_* value, such as ssl.PROTOCOL_TLS_CLIENT")


#: py-amqp's SSL arguments (those its SSL transport takes, see
#: :func:`.internals.ssl_arguments_problem`), plus ``check_hostname``, with a check each and an
#: example value (as written in a configuration module).
ARGUMENTS: Mapping[str, tuple[Callable[[Any], Any], str]] = {
    "ca_certs": (_file, repr(_CA)),
    "certfile": (_file, "'/etc/ssl/client.pem'"),
    "keyfile": (_file, "'/etc/ssl/client.key'"),
    "cert_reqs": (_cert_reqs, "ssl.CERT_REQUIRED"),
    "server_hostname": (_text, "'rabbit.example.com'"),
    "check_hostname": (_flag, "False"),
    "ciphers": (_text, "'ECDHE+AESGCM'"),
    "ssl_version": (_protocol, "ssl.PROTOCOL_TLS_CLIENT"),
    "tls_minimum_version": (_tls_version, "ssl.TLSVersion.TLSv1_2"),
    "tls_maximum_version": (_tls_version, "ssl.TLSVersion.TLSv1_3"),
}


@attrs.frozen
class TLS:
    """py-amqp's SSL arguments for one broker URL, checked and complete: ``cert_reqs`` is always
    there, and ``server_hostname`` (the name the certificate must be issued for) whenever the
    host name is checked."""

    arguments: Mapping[str, Any]

    @property
    def verified(self) -> bool:
        """Whether the server's certificate must be signed by a trusted CA."""
        return bool(self.arguments["cert_reqs"] != ssl.CERT_NONE)

    @property
    def checks_hostname(self) -> bool:
        """Whether the certificate must be issued for ``server_hostname``."""
        return "server_hostname" in self.arguments

    def info(self) -> Any:
        """The arguments as ``workerctl inspect`` may show them."""
        shown = {name: value.name if isinstance(value, (ssl.VerifyMode, ssl.TLSVersion)) else value
                 for name, value in self.arguments.items()}
        return redact_value("ssl", shown)


def broker_tls(url: str, scheme: str, use_ssl: Any, option: Any) -> TLS | None:
    """The broker's TLS (``None``: plain TCP) for ``url``, from its scheme, the setting
    ``broker_use_ssl`` and the transport option ``ssl``."""
    for part in url.split(";"):
        query = [name for name, _ in parse_qsl(urlsplit(part.strip()).query) if name.startswith("ssl")]
        if query:
            # kombu would hand them to py-amqp under names it does not take
            raise ConfigurationError(
                f"broker URL {redact_url(part.strip())!r} has TLS arguments in its query "
                f"({', '.join(query)}); the AMQP transport takes them from broker_use_ssl, for example "
                f"broker_use_ssl={{'ca_certs': '{_CA}'}}"
            )
    source, given = _one_of(use_ssl, option)
    if given is None and scheme != "amqps":
        return None
    arguments = {name: _checked(source, name, value) for name, value in (given or {}).items()}
    return _complete(arguments, url)


def _one_of(use_ssl: Any, option: Any) -> tuple[str, Any]:
    """The setting that turns TLS on (True, or a non-empty mapping) and its value (``{}`` for
    True), or ``("", None)``. None, False and an empty mapping give nothing, as in Celery."""
    chosen = [(name, value) for name, value in (("broker_use_ssl", use_ssl),
                                                ("broker_transport_options['ssl']", option)) if value]
    if len(chosen) == 2 and chosen[0][1] != chosen[1][1]:
        raise ConfigurationError(
            f"broker_use_ssl and broker_transport_options['ssl'] both give TLS arguments, and they differ "
            f"({redact_value('ssl', use_ssl)!r} and {redact_value('ssl', option)!r}): set only one of them"
        )
    if not chosen:
        return "", None
    name, value = chosen[0]
    if value is True:
        return name, {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ConfigurationError(
            f"{name} must be True or a mapping of py-amqp SSL arguments (got {redact_value('ssl', value)!r} "
            f"that is a {type(value).__name__}); for example broker_use_ssl={{'ca_certs': '{_CA}'}}"
        )
    return name, value


def _checked(source: str, name: str, value: Any) -> Any:
    if name not in ARGUMENTS:
        hint = (f" Did you mean {name[4:]!r}?" if name.startswith("ssl_") and name[4:] in ARGUMENTS
                else did_you_mean(name, ARGUMENTS))
        if name == "context":
            hint = " Give the CA with ca_certs, and turn the host name check off with check_hostname=False."
        raise ConfigurationError(
            f"unknown TLS argument {name!r} in {source} for the AMQP broker.{hint} It takes py-amqp's SSL "
            f"arguments: {', '.join(ARGUMENTS)}"
        )
    check, example = ARGUMENTS[name]
    try:
        return check(value)
    except _Invalid as exc:
        hint = did_you_mean(value, _CERT_REQS) if name == "cert_reqs" and isinstance(value, str) else ""
        raise ConfigurationError(
            f"TLS argument {name!r} in {source} must be {exc.expected} (got {redact_value(name, value)!r} "
            f"that is a {type(value).__name__}{exc.reason and ': ' + exc.reason}).{hint} For example "
            f"broker_use_ssl={{{name!r}: {example}}}"
        ) from None


def _complete(arguments: dict[str, Any], url: str) -> TLS:
    where = redact_url(url)
    arguments.setdefault("cert_reqs", ssl.CERT_REQUIRED)
    check = arguments.pop("check_hostname", None)
    if arguments["cert_reqs"] == ssl.CERT_NONE:
        if check or "server_hostname" in arguments:
            named = "check_hostname=True" if check else f"server_hostname={arguments['server_hostname']!r}"
            raise ConfigurationError(
                f"the AMQP broker at {where} has {named} but cert_reqs=ssl.CERT_NONE: a host name is "
                f"checked only on a verified certificate; drop cert_reqs, or leave {named.split('=')[0]} out"
            )
        _warn_once(f"TLS to the AMQP broker at {where} does not verify the server's certificate "
                   f"(cert_reqs=CERT_NONE): whoever answers at that address is trusted. Drop cert_reqs "
                   f"and give the CA with ca_certs to verify it")
    elif check is False:
        if "server_hostname" in arguments:
            raise ConfigurationError(
                f"the AMQP broker at {where} has check_hostname=False and server_hostname="
                f"{arguments['server_hostname']!r}: server_hostname is the name to check; leave one out"
            )
        _warn_once(f"TLS to the AMQP broker at {where} does not check the server's host name "
                   f"(check_hostname=False): any certificate a trusted CA signed is accepted, whatever "
                   f"host it was issued for")
    elif "server_hostname" not in arguments:
        # py-amqp checks the name only when it is given. Not None for kombu to fill in: kombu
        # turns "localhost" into "127.0.0.1" first, which a certificate for localhost does not name.
        arguments["server_hostname"] = urlsplit(url.split(";")[0].strip()).hostname or "localhost"
    return TLS(arguments)


#: warnings already given by this process (and by the one it was forked from)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    # The arguments are resolved for every connection and every client: one line is enough.
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)

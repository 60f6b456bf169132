"""TLS for the Redis broker and the Redis result backend: the SSL arguments of the URL's query,
the settings and the transport options, gathered and checked once. The server's certificate is
verified, and its host name checked, unless the configuration turns that off in so many words."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.redaction import redact_url, redact_value

from .tls_arguments import ARGUMENTS, CERT_REQS, Invalid, check_argument, url_text

__all__ = ["TLS", "backend_tls", "broker_tls", "without_tls_query"]

logger = logging.getLogger(__name__)

_CA = "/etc/ssl/certs/ca.pem"
_URL = "rediss://:password@redis.example.com:6380/0"


@attrs.frozen
class TLS:
    """redis-py's SSL arguments for one broker or result backend, checked and complete:
    ``ssl_cert_reqs`` and ``ssl_check_hostname`` are always there."""

    arguments: Mapping[str, Any]

    @property
    def verified(self) -> bool:
        """Whether the server's certificate must be signed by a trusted CA."""
        return bool(self.arguments["ssl_cert_reqs"] != "none")

    @property
    def checks_hostname(self) -> bool:
        """Whether the certificate must be issued for the URL's host."""
        return bool(self.arguments["ssl_check_hostname"])

    def info(self) -> Any:
        """The arguments as ``workerctl inspect`` may show them (the key's password hidden)."""
        return redact_value("ssl", dict(self.arguments))


@attrs.frozen
class _Role:
    """Whose TLS it is, for the messages."""

    noun: str
    url: str
    setting: str


_BROKER = _Role("Redis broker", "the broker URL", "broker_use_ssl")
_BACKEND = _Role("Redis result backend", "the result backend URL", "redis_backend_use_ssl")


@attrs.frozen
class _Source:
    """Where SSL arguments were given, and how an example is written there (``None``: a URL)."""

    label: str
    template: str | None = None

    def example(self, arguments: Mapping[str, Any]) -> str:
        if self.template is None:
            return f"{_URL}?" + "&".join(f"{name}={url_text(value)}" for name, value in arguments.items())
        return self.template.format(repr(dict(arguments)))


def broker_tls(url: str, scheme: str, use_ssl: Any, option: Any) -> TLS | None:
    """The broker's TLS (``None``: plain TCP) from the ``;``-separated ``url``, the setting
    ``broker_use_ssl`` and the transport option ``ssl``."""
    given = _one_of(
        (_Source("broker_use_ssl", "broker_use_ssl={}"), use_ssl),
        (_Source("broker_transport_options['ssl']", "broker_transport_options={{'ssl': {}}}"), option),
    )
    return _resolve(_BROKER, url, scheme, given)


def backend_tls(url: str, scheme: str, use_ssl: Any) -> TLS | None:
    """The result backend's TLS (``None``: plain TCP) from ``url`` and ``redis_backend_use_ssl``."""
    given = _one_of((_Source("redis_backend_use_ssl", "redis_backend_use_ssl={}"), use_ssl))
    return _resolve(_BACKEND, url, scheme, given)


def without_tls_query(url: str) -> str:
    """``url`` without its ``ssl_*`` query parameters: redis-py lets a URL's query override the
    arguments it is given, and does not know Celery's spellings (``CERT_REQUIRED``)."""
    parts = []
    for part in url.split(";"):
        base, _, query = part.partition("?")
        kept = [item for item in query.split("&")
                if item and not unquote(item.partition("=")[0]).startswith("ssl_")]
        parts.append(f"{base}?{'&'.join(kept)}" if kept else base)
    return ";".join(parts)


def _one_of(*given: tuple[_Source, Any]) -> tuple[_Source, Mapping[str, Any]] | None:
    """The one source that turns TLS on (True, or a non-empty mapping), or None. None, False and
    an empty mapping give nothing, as in Celery; two sources must agree."""
    chosen = [(source, value) for source, value in given if value]
    if len(chosen) > 1 and any(value != chosen[0][1] for _, value in chosen[1:]):
        (first, one), (second, other) = chosen[:2]
        raise ConfigurationError(
            f"{first.label} and {second.label} both give TLS arguments, and they differ "
            f"({redact_value('ssl', one)!r} and {redact_value('ssl', other)!r}): set only one of them"
        )
    if not chosen:
        return None
    source, value = chosen[0]
    if value is True:
        return source, {}
    if not isinstance(value, Mapping) or not all(isinstance(name, str) for name in value):
        raise ConfigurationError(
            f"{source.label} must be True or a mapping of redis-py SSL arguments (got "
            f"{redact_value('ssl', value)!r} that is a {type(value).__name__}); for example "
            f"{source.example({'ssl_cert_reqs': 'required', 'ssl_ca_certs': _CA})}"
        )
    return source, value


def _resolve(role: _Role, url: str, scheme: str,
             given: tuple[_Source, Mapping[str, Any]] | None) -> TLS | None:
    from_url = _url_arguments(role, url, scheme)
    arguments: dict[str, Any] = {}
    if given is not None:
        source, values = given
        arguments = {name: _checked(role, source, name, value, from_url=False)
                     for name, value in values.items()}
        for name, value in from_url.items():
            if name in arguments and arguments[name] != value:
                raise ConfigurationError(
                    f"TLS argument {name} is {redact_value(name, value)!r} in {role.url} but "
                    f"{redact_value(name, arguments[name])!r} in {source.label}: give it in one place"
                )
    arguments.update(from_url)
    # A setting turns TLS on for redis:// too, as in Celery: asking for TLS and getting plain
    # TCP without a word would be worse.
    if given is None and scheme != "rediss":
        return None
    where = redact_url(url)
    if "ssl_cert_reqs" not in arguments:
        raise ConfigurationError(
            f"the {role.noun} at {where} uses TLS but ssl_cert_reqs is not set, so nothing says whether "
            f"the server's certificate is verified: set ssl_cert_reqs='required' and the CA that signed "
            f"it, for example {role.setting}={{'ssl_cert_reqs': 'required', 'ssl_ca_certs': '{_CA}'}} or "
            f"{_URL}?ssl_cert_reqs=required&ssl_ca_certs={_CA}; ssl_cert_reqs='none' encrypts without "
            f"verifying (not recommended)"
        )
    if arguments["ssl_cert_reqs"] == "none":
        if arguments.get("ssl_check_hostname") is True:
            raise ConfigurationError(
                f"the {role.noun} at {where} has ssl_check_hostname=True but ssl_cert_reqs='none': a host "
                f"name is checked only on a verified certificate; set ssl_cert_reqs='required', or leave "
                f"ssl_check_hostname out"
            )
        arguments["ssl_check_hostname"] = False
        _warn_once(f"TLS to the {role.noun} at {where} does not verify the server's certificate "
                   f"(ssl_cert_reqs='none'): whoever answers at that address is trusted. Set "
                   f"ssl_cert_reqs='required' and ssl_ca_certs to verify it")
    else:
        # redis-py 8 checks the host name by default; said here so no default can change it
        arguments.setdefault("ssl_check_hostname", True)
        if not arguments["ssl_check_hostname"]:
            _warn_once(f"TLS to the {role.noun} at {where} does not check the server's host name "
                       f"(ssl_check_hostname=False): any certificate a trusted CA signed is accepted, "
                       f"whatever host it was issued for")
    return TLS(arguments)


def _url_arguments(role: _Role, url: str, scheme: str) -> dict[str, Any]:
    """The ``ssl_*`` query parameters of ``url`` (the same in each ``;``-separated URL), checked."""
    queries = [
        {name: value for name, value in parse_qsl(urlsplit(part.strip()).query, keep_blank_values=True)
         if name.startswith("ssl_")}
        for part in url.split(";") if part.strip()
    ]
    raw = queries[0] if queries else {}
    if any(query != raw for query in queries[1:]):
        raise ConfigurationError(
            f"the ';'-separated URLs of the {role.noun} ({redact_url(url)}) give different TLS "
            f"arguments: give the same ones in each URL, or give them once in {role.setting}"
        )
    if raw and scheme != "rediss":
        where = ("give them in " + role.setting if scheme == "sentinel"
                 else f"write rediss:// for TLS, for example {_URL}?ssl_cert_reqs=required")
        raise ConfigurationError(
            f"{role.url} {redact_url(url)} has TLS arguments ({', '.join(raw)}) in a {scheme}:// URL, "
            f"whose query is not read for TLS: {where}"
        )
    source = _Source(role.url)
    return {name: _checked(role, source, name, value, from_url=True) for name, value in raw.items()}


def _checked(role: _Role, source: _Source, name: str, value: Any, *, from_url: bool) -> Any:
    if name not in ARGUMENTS:
        hint = f" Did you mean 'ssl_{name}'?" if f"ssl_{name}" in ARGUMENTS else did_you_mean(name, ARGUMENTS)
        raise ConfigurationError(
            f"unknown TLS argument {name!r} in {source.label} for the {role.noun}.{hint} It takes "
            f"redis-py's SSL arguments: {', '.join(ARGUMENTS)}"
        )
    try:
        return check_argument(name, value, from_url)
    except Invalid as exc:
        hint = did_you_mean(value, CERT_REQS) if name == "ssl_cert_reqs" and isinstance(value, str) else ""
        raise ConfigurationError(
            f"TLS argument {name!r} in {source.label} must be {exc.expected} (got "
            f"{redact_value(name, value)!r} that is a {type(value).__name__}"
            f"{exc.reason and ': ' + exc.reason}).{hint} For example "
            f"{source.example({name: ARGUMENTS[name][1]})}"
        ) from None


#: warnings already given by this process (and by the one it was forked from)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    # The arguments are resolved for every connection and every client: one line is enough.
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)

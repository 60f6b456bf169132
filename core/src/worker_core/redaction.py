"""Hiding secrets wherever a value leaves the process: URLs, settings and options, log lines.

Every reply, event, banner, log line, error message and ``workerctl`` output that may carry a
broker or backend URL, a transport option or a setting goes through :func:`redact_url` or
:func:`redact_value`; :class:`SecretFilter` is the last guard, on the log handlers: it replaces
the secrets the worker knows of (:func:`secrets_of`) in every formatted line, including those
written by kombu, py-amqp and redis-py.

Public (see :mod:`worker_core`): a plugin shows URLs and options through these too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from .protocol.message import safe_repr

__all__ = [
    "MASK",
    "SecretFilter",
    "install_secret_filter",
    "is_secret_name",
    "redact_text",
    "redact_url",
    "redact_value",
    "secrets_of",
]

#: what stands in for a secret value
MASK = "********"
#: names (settings, option keys, URL query parameters) whose values are secrets
_SECRET_NAME = re.compile(
    r"pass(word|wd|phrase)?$|^pwd$|password|passwd|secret|token|credential|api_?key|private_?key"
    r"|^security_key$|signature|^auth$",
    re.IGNORECASE,
)
#: a secret shorter than this is not searched for in free text (it would mask ordinary words)
MIN_TEXT_SECRET = 4


def is_secret_name(name: str) -> bool:
    """Whether a setting, option key or URL query parameter named ``name`` holds a secret."""
    return bool(_SECRET_NAME.search(name))


def _redact_one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    location, qmark, query = rest.partition("?")
    if "@" in location:
        credentials, _at, host = location.rpartition("@")
        user, colon, _password = credentials.partition(":")
        location = f"{user}{':**' if colon else ''}@{host}"
    if qmark and query:
        shown = []
        for part in query.split("&"):
            name, equals, value = part.partition("=")
            shown.append(f"{name}=**" if equals and value and is_secret_name(unquote(name)) else part)
        query = "&".join(shown)
    return f"{scheme}://{location}{qmark}{query}"


def redact_url(url: str) -> str:
    """The URL (or ``;``-separated URLs) with every password hidden: in the user part
    (``redis://:**@host``, ``amqp://user:**@host//``) and in secret-looking query parameters
    (``?password=**``)."""
    if "://" not in url:
        return url
    return ";".join(_redact_one(part) for part in url.split(";"))


def redact_value(name: str, value: Any) -> Any:
    """``value`` (a setting or option named ``name``) as it may be shown: JSON-able, secret
    values replaced by :data:`MASK`, URLs redacted, mappings and lists redacted item by item."""
    if is_secret_name(name) and value not in (None, "", {}, [], ()):
        return MASK
    if isinstance(value, str):
        return redact_url(value) if "://" in value else value
    if isinstance(value, Mapping):
        return {str(key): redact_value(str(key), item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [redact_value(name, item) for item in value]
    if value is None or isinstance(value, (int, float, bool)):
        return value
    return safe_repr(value)


def _url_secrets(url: str) -> Iterator[str]:
    for part in url.split(";"):
        _scheme, sep, rest = part.partition("://")
        if not sep:
            continue
        location, _, query = rest.partition("?")
        if "@" in location:
            credentials = location.rpartition("@")[0]
            user, colon, password = credentials.partition(":")
            # A password equal to the user name (guest:guest) is shown with every URL already:
            # searching for it would only hide the user name wherever it appears.
            if colon and password and password != user:
                yield password
                yield unquote(password)
        for name, value in parse_qsl(query, keep_blank_values=False):
            if is_secret_name(name):
                yield value
                yield quote(value, safe="")


def _value_secrets(name: str, value: Any) -> Iterator[str]:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        if is_secret_name(name) and value:
            yield value
        elif "://" in value:
            yield from _url_secrets(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _value_secrets(str(key), item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _value_secrets(name, item)


def secrets_of(values: Mapping[str, Any]) -> frozenset[str]:
    """The secret strings in ``values`` (setting names to values): URL passwords and the values
    of secret-looking names, searched through nested mappings and lists. Secrets shorter than
    :data:`MIN_TEXT_SECRET` characters are left out (see :class:`SecretFilter`)."""
    found: set[str] = set()
    for name, value in values.items():
        found.update(_value_secrets(name, value))
    return frozenset(secret for secret in found if len(secret) >= MIN_TEXT_SECRET)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by :data:`MASK` (longest first, so a secret
    that contains another is hidden whole)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class SecretFilter(logging.Filter):
    """A log filter that hides known secrets in every record it passes: the message is
    formatted once with its arguments, and the exception text too, then searched."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets: frozenset[str] = frozenset(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = self.secrets
        if not secrets:
            return True
        message = record.getMessage()
        hidden = redact_text(message, secrets)
        if hidden is not message and hidden != message:
            record.msg, record.args = hidden, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, secrets)
        return True


def install_secret_filter(handlers: Iterable[logging.Handler], secrets: Iterable[str]) -> SecretFilter:
    """Put one :class:`SecretFilter` holding ``secrets`` on each handler (replacing an earlier
    one) and return it."""
    guard = SecretFilter(secrets)
    for handler in handlers:
        for existing in [f for f in handler.filters if isinstance(f, SecretFilter)]:
            handler.removeFilter(existing)
        handler.addFilter(guard)
    return guard

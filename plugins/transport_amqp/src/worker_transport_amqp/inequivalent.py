"""What RabbitMQ says when a declaration differs from what exists (``PRECONDITION_FAILED``,
406: "inequivalent arg 'x-queue-type' for queue 'q' ..."), read into the argument and both values."""

from __future__ import annotations

import re
from typing import Any

import attrs

__all__ = ["FLAGS", "MISSING", "Mismatch", "mismatch_of"]

#: the value of an argument one side does not set
MISSING: Any = None

#: RabbitMQ's words for a declaration that differs from what exists
_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']*)' in vhost "
    r"'[^']*': received (?P<received>.+?) but current is (?P<current>.+?)\s*$"
)
_TYPED = re.compile(r"^the value '(?P<value>.*)' of type '(?P<type>\w+)'$")
_INTEGER_TYPES = frozenset(
    {
        "signedint",
        "long",
        "short",
        "byte",
        "unsignedbyte",
        "unsignedshort",
        "unsignedint",
        "signedshort",
        "signedbyte",
        "timestamp",
    }
)
#: the queue flags RabbitMQ compares besides the arguments
FLAGS = ("durable", "auto_delete", "exclusive")


@attrs.frozen
class Mismatch:
    """One argument RabbitMQ found different: what was sent, what the broker has."""

    kind: str
    name: str
    argument: str
    received: Any
    current: Any


def _value(text: str) -> Any:
    text = text.strip()
    if text == "none":
        return MISSING
    typed = _TYPED.match(text)
    if typed is not None:
        value, kind = typed.group("value"), typed.group("type")
        if kind in _INTEGER_TYPES:
            try:
                return int(value)
            except ValueError:
                return value
        if kind in ("double", "float"):
            return float(value)
        if kind == "bool":
            return value == "true"
        return value
    if text in ("'true'", "'false'"):
        return text == "'true'"
    return text.strip("'")


def mismatch_of(exc: BaseException) -> Mismatch | None:
    """The argument a broker's ``PRECONDITION_FAILED`` (406) names, or None for other errors."""
    code = getattr(exc, "reply_code", None) or getattr(exc, "code", None)
    if code != 406:
        return None
    found = _INEQUIVALENT.search(str(exc))
    if found is None:
        return None
    argument = (
        found.group("argument").replace("-", "_")
        if found.group("argument") in ("auto-delete",)
        else found.group("argument")
    )
    return Mismatch(
        kind=found.group("kind"),
        name=found.group("name"),
        argument=argument,
        received=_value(found.group("received")),
        current=_value(found.group("current")),
    )

"""Messages of kombu's virtual transports (embedded, Redis) that never fail to be built.

kombu builds a message inside the transport, before the consumer sees it: a body that is not
valid for its ``body_encoding``, an encoding kombu does not know, headers or delivery info of the
wrong kind, or an envelope that is not a kombu envelope at all raised out of ``drain_events`` and
stopped the worker, and the message came back after every restart. Here the channel checks each
envelope (:func:`envelope_problem`, :func:`tag_problem`); what cannot be read, and what fails
while the message is built, becomes a message that carries the reason in kombu's ``errors``,
which kombu's consumer hands to the worker's decode-error callback: the worker rejects it with
one log line (and so removes it from the broker) and carries on.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import attrs
from kombu import message as _kombu_message
from kombu.transport import virtual as _virtual

from ..exceptions import DecodeError, ProtocolError
from ..protocol import safe_repr

__all__ = ["Message", "Unreadable", "envelope_problem", "fresh_tag", "tag_problem"]

virtual: Any = _virtual
kombu_message: Any = _kombu_message

#: how much of an unreadable envelope a reason quotes
_QUOTED = 120


@attrs.frozen
class Unreadable:
    """A delivery whose envelope could not be read, given to the consumer with the reason.

    ``delivery_tag`` is the tag the broker knows the delivery by, or a fresh one when it has
    none (then nothing in the broker holds it, and acknowledging it changes nothing).
    """

    reason: str
    delivery_tag: str
    queue: str

    def envelope(self) -> dict[str, Any]:
        """A minimal kombu envelope standing for the unreadable one (what kombu keeps as raw)."""
        return {"body": None, "headers": {}, "content-type": None, "content-encoding": None,
                "properties": {"delivery_tag": self.delivery_tag,
                               "delivery_info": {"exchange": "", "routing_key": self.queue}}}


def fresh_tag() -> str:
    """A delivery tag for a delivery that came without one."""
    return str(uuid.uuid4())


def _quote(value: Any) -> str:
    return safe_repr(value, _QUOTED)


def envelope_problem(payload: Any) -> str | None:
    """Why no message can be built from ``payload`` (it must be a mapping whose ``properties``
    are a mapping), or None."""
    if not isinstance(payload, Mapping):
        kind = type(payload).__name__
        return f"its envelope must be a JSON object (got {_quote(payload)} that is a {kind})"
    properties = payload.get("properties")
    if not isinstance(properties, Mapping):
        return f"its envelope's 'properties' must be an object (got {_quote(properties)})"
    return None


def tag_problem(payload: Mapping[str, Any]) -> str | None:
    """Why ``payload`` carries no delivery tag that can be acknowledged, or None."""
    tag = payload["properties"].get("delivery_tag")
    if not isinstance(tag, str) or not tag:
        return f"its envelope has no delivery tag (got {_quote(tag)})"
    return None


def _text(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ProtocolError(f"its envelope's {key!r} must be a string (got {_quote(value)})")


class Message(virtual.Message):  # type: ignore[misc]
    """kombu's virtual message, built from an envelope the channel checked or from an
    :class:`Unreadable`; whatever is wrong with it ends in ``errors``, never in an exception."""

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        if not isinstance(payload, Unreadable):
            # Channels check what they deliver to task consumers; this catches the rest (a
            # fanout message on Redis's pub/sub, read by kombu itself).
            problem = envelope_problem(payload) or tag_problem(payload)
            if problem is not None:
                payload = Unreadable(problem, fresh_tag(), "")
        if isinstance(payload, Unreadable):
            self.errors = [(ProtocolError, ProtocolError(payload.reason), None)]
            envelope = payload.envelope()
            self._build(envelope, envelope["properties"], None, {}, None, None, channel, kwargs)
            return
        properties = payload["properties"]
        headers = payload.get("headers")
        body = payload.get("body")
        try:
            content_type = _text(payload, "content-type")
            content_encoding = _text(payload, "content-encoding")
            info = properties.get("delivery_info")
            if info is not None and not isinstance(info, Mapping):
                raise ProtocolError(f"its 'delivery_info' must be an object (got {_quote(info)})")
            if body:
                body = _decode_body(channel, body, properties.get("body_encoding"))
        except ProtocolError as exc:
            self.errors = [(type(exc), exc, None)]
            body, content_type, content_encoding = None, None, None
        # kombu reads headers.get('compression') while it builds the message: headers of the
        # wrong kind are set afterwards, for the worker's decoder to name.
        mapping = headers if isinstance(headers, Mapping) else {}
        self._build(payload, properties, body, mapping, content_type, content_encoding, channel, kwargs)
        if headers and not isinstance(headers, Mapping):
            self.headers = headers

    def _build(self, payload: Any, properties: Mapping[str, Any], body: Any, headers: Mapping[str, Any],
               content_type: str | None, content_encoding: str | None, channel: Any,
               kwargs: dict[str, Any]) -> None:
        info = properties.get("delivery_info")
        kombu_message.Message.__init__(
            self, body=body, channel=channel, delivery_tag=properties["delivery_tag"],
            content_type=content_type, content_encoding=content_encoding, headers=headers,
            properties=properties, delivery_info=info if isinstance(info, Mapping) else {},
            postencode="utf-8", **kwargs,
        )
        self._raw = payload


def _decode_body(channel: Any, body: Any, encoding: Any) -> Any:
    """The body undone from its ``body_encoding`` (kombu's codecs: base64, or none)."""
    if not encoding:
        return body
    codec = channel.codecs.get(encoding) if isinstance(encoding, str) else None
    if codec is None:
        known = ", ".join(sorted(channel.codecs))
        raise DecodeError(f"its body_encoding {_quote(encoding)} is not one kombu knows ({known})")
    try:
        return codec.decode(body)
    except Exception as exc:
        raise DecodeError(f"its body is not valid {encoding}: {type(exc).__name__}: {exc}") from None

"""The wire format of a signed message, as Celery's ``auth`` serializer writes it: base64 of the
signer's id, the signature, the inner content type and encoding, and the signed inner body."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import attrs

from ..exceptions import SecurityError
from ..protocol.message import safe_repr

__all__ = ["AUTH", "CONTENT_ENCODING", "CONTENT_TYPE", "SEPARATOR", "Envelope", "pack", "unpack"]

#: the serializer's name in kombu's registry, and the content type and encoding of its messages
AUTH = "auth"
CONTENT_TYPE = "application/data"
CONTENT_ENCODING = "utf-8"
#: between the fields; base64 never holds it, and the body (which may) is the last field
SEPARATOR = b"\x00\x01"
_FIELDS = 5


@attrs.frozen
class Envelope:
    """One signed message, unpacked."""

    #: the signing certificate's id: its issuer's attribute values and its serial number
    signer: str
    signature: bytes
    content_type: str
    content_encoding: str
    #: the inner body exactly as signed
    body: bytes


def pack(envelope: Envelope) -> str:
    """The message body for ``envelope``."""
    fields = (
        base64.b64encode(envelope.signer.encode("utf-8")),
        base64.b64encode(envelope.signature),
        envelope.content_type.encode("utf-8"),
        envelope.content_encoding.encode("utf-8"),
        envelope.body,
    )
    return base64.b64encode(SEPARATOR.join(fields)).decode("ascii")


def _not_signed(why: str, data: Any) -> SecurityError:
    return SecurityError(
        f"body is not a signed message ({why}; got {safe_repr(data, 60)}): a signed body is base64 of "
        f"signer, signature, content type, content encoding and body, as task_serializer='auth' writes it"
    )


def _base64(field: bytes) -> bytes:
    return base64.b64decode(field, validate=True)


def unpack(data: str | bytes | bytearray | memoryview) -> Envelope:
    """The envelope a message body holds.

    :raise SecurityError: the body is not a signed message; the error says which part is wrong.
    """
    raw = data.encode("ascii", "replace") if isinstance(data, str) else bytes(data)
    try:
        decoded = _base64(raw)
    except (binascii.Error, ValueError):
        raise _not_signed("not base64", data) from None
    fields = decoded.split(SEPARATOR, _FIELDS - 1)
    if len(fields) != _FIELDS:
        raise _not_signed(f"{len(fields)} of its {_FIELDS} fields", data)
    signer, signature, content_type, content_encoding, body = fields
    try:
        return Envelope(
            signer=_base64(signer).decode("utf-8"),
            signature=_base64(signature),
            content_type=content_type.decode("ascii"),
            content_encoding=content_encoding.decode("ascii"),
            body=body,
        )
    except (binascii.Error, ValueError):
        raise _not_signed("its signer, signature, content type or encoding is malformed", data) from None

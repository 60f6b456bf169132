"""Stored results in the serializer Celery stores them with (``result_serializer``: json,
msgpack, yaml, pickle or any serializer registered with kombu), and read back in whichever of
those a result was stored, when ``result_accept_content`` accepts it.

A stored result carries no content type, so its format is told by its first byte, which each
of Celery's serializers fixes for a dict: ``{`` (or ``[``) for JSON, ``0x80`` (a pickle protocol
mark) for pickle, a msgpack map mark (``0x81``-``0x8f``, ``0xde``, ``0xdf``) for msgpack, and
any other text for YAML's block style. A serializer of one's own is read as the configured one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kombu.serialization import dumps as kombu_dumps
from kombu.serialization import loads as kombu_loads
from kombu.serialization import prepare_accept_content
from kombu.utils import json as _json

from ..exceptions import ResultDecodeError

if TYPE_CHECKING:
    from ..app.settings import Settings

__all__ = ["BUILTIN", "ResultCodec"]

# kombu's JSON codec (datetimes, UUIDs, Decimals, bytes) is not annotated.
json_dumps: Callable[[Any], str] = _json.dumps
json_loads: Callable[[str | bytes], Any] = _json.loads

JSON = "application/json"
PICKLE = "application/x-python-serialize"
#: Celery's own result serializers: their content types and encodings, as kombu registers them
BUILTIN: dict[str, tuple[str, str]] = {
    "json": (JSON, "utf-8"),
    "msgpack": ("application/x-msgpack", "binary"),
    "yaml": ("application/x-yaml", "utf-8"),
    "pickle": (PICKLE, "binary"),
}
_BY_TYPE = {content_type: name for name, (content_type, _) in BUILTIN.items()}
_MSGPACK_MAP = frozenset({*range(0x81, 0x90), 0xDE, 0xDF})
#: what Celery 5.7 puts before a result it compressed (``result_compression``)
_COMPRESSED = b"\x00celery-compressed\x00"


class ResultCodec:
    """Encodes a backend's metas with its serializer (or a task's own) and decodes stored ones.

    :param serializer: the ``result_serializer`` setting (kombu's name for it).
    :param accept: the serializer names or content types stored results may be read in
        (``result_accept_content``, else ``accept_content``). JSON is always read: it carries
        data only.
    """

    def __init__(self, serializer: str = "json", accept: Iterable[str] = ("json",)) -> None:
        self.serializer = serializer
        self.accept = frozenset(prepare_accept_content(list(accept))) | {JSON}
        self._custom: dict[str, tuple[str, str]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> ResultCodec:
        return cls(settings.result_serializer, settings.result_accept_content or settings.accept_content)

    # -- storing ---------------------------------------------------------------------------------

    def encode(self, meta: Any, serializer: str | None = None) -> str | bytes:
        """``meta`` (or any value, such as a chord's part) in ``serializer`` (None: the
        configured one): text for JSON and YAML, bytes for msgpack and pickle."""
        name = serializer or self.serializer
        if name == "json":
            return json_dumps(meta)  # kombu's JSON, as kombu's dumps would write it, without its lookups
        _, _, payload = kombu_dumps(meta, serializer=name)
        return payload  # type: ignore[no-any-return]

    def encode_message(self, meta: dict[str, Any],
                       serializer: str | None = None) -> tuple[str | bytes, str, str]:
        """``meta`` as the body of a message, with the content type and encoding that name its
        format: ``(body, content_type, content_encoding)``."""
        name = serializer or self.serializer
        if name == "json":
            return json_dumps(meta), JSON, "utf-8"
        content_type, encoding, payload = kombu_dumps(meta, serializer=name)
        return payload, content_type, encoding

    # -- reading ---------------------------------------------------------------------------------

    def decode(self, payload: bytes | str, what: str) -> dict[str, Any]:
        """The meta stored in ``payload``; ``what`` names it in errors (``the result of task X``).

        :raise ResultDecodeError: the payload is in a format not accepted, or not a meta.
        """
        content_type, encoding = self._format(payload, what)
        return self._loads(payload, content_type, encoding, what)

    def decode_message(self, body: bytes | str, content_type: str | None, content_encoding: str | None,
                       what: str) -> dict[str, Any]:
        """The meta a message carries in the format its ``content_type`` names (a message says
        its format: nothing is guessed); ``what`` names it in errors.

        :raise ResultDecodeError: the format is not accepted, or the body is not a meta.
        """
        content_type = content_type or JSON
        if content_type != JSON and content_type not in self.accept:
            name = _BY_TYPE.get(content_type, content_type)
            raise ResultDecodeError(self._refusal(name, what, "is sent in"))
        return self._loads(body, content_type, content_encoding or "binary", what)

    def _loads(self, data: bytes | str, content_type: str, encoding: str, what: str) -> dict[str, Any]:
        """The meta ``data`` holds in ``content_type``; ``what`` names it in errors."""
        try:
            if content_type == JSON:
                meta = json_loads(data)
            else:
                meta = kombu_loads(data, content_type, encoding, accept=self.accept)
        except Exception as exc:
            raise ResultDecodeError(
                f"{what} cannot be read as {_BY_TYPE.get(content_type, content_type)}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(meta, dict):
            raise ResultDecodeError(f"{what} is not Celery's format: it holds a {type(meta).__name__}, "
                                    f"not a mapping")
        return meta

    def _refusal(self, name: str, what: str, verb: str = "is stored in") -> str:
        accepted = ", ".join(sorted(_BY_TYPE.get(item, item) for item in self.accept))
        advice = ("reading pickle runs the code it holds: add 'pickle' to result_accept_content only "
                  "when no one else can write to the result backend" if name == "pickle"
                  else f"add {name!r} to the result_accept_content setting to read it")
        return (f"{what} {verb} {name}, which this app does not accept for results "
                f"(accepted: {accepted}); {advice}")

    def decode_value(self, payload: bytes | str, what: str) -> Any:
        """A value :meth:`encode` stored that need not be a meta (a chord's part is a list):
        JSON is read as JSON, anything else in the configured serializer.

        :raise ResultDecodeError: it cannot be read.
        """
        first = payload[:1]
        try:
            if first in (b"[", b"{", "[", "{"):
                return json_loads(payload)
            if self.serializer in BUILTIN:
                content_type, encoding = BUILTIN[self.serializer]
            else:
                content_type, encoding = self._custom_format(self.serializer)
            return kombu_loads(payload, content_type, encoding, accept=self.accept)
        except Exception as exc:
            raise ResultDecodeError(f"{what} cannot be read as {self.serializer}: {type(exc).__name__}: "
                                    f"{exc}") from None

    def _format(self, payload: bytes | str, what: str) -> tuple[str, str]:
        if not payload:
            raise ResultDecodeError(f"{what} is empty")
        first = payload[0] if isinstance(payload, (bytes, bytearray)) else ord(payload[0])
        if first in (0x7B, 0x5B):  # "{" or "[": JSON's containers
            return JSON, "utf-8"
        if self.serializer not in BUILTIN:
            return self._custom_format(self.serializer)
        if isinstance(payload, (bytes, bytearray)) and payload.startswith(_COMPRESSED):
            raise ResultDecodeError(f"{what} was compressed (Celery's result_compression), which this app "
                                    f"does not read: store results uncompressed")
        if first == 0x80:
            name = "pickle"
        elif first in _MSGPACK_MAP:
            name = "msgpack"
        else:
            name = "yaml"
        content_type, encoding = BUILTIN[name]
        if content_type not in self.accept:
            raise ResultDecodeError(self._refusal(name, what))
        return content_type, encoding

    def _custom_format(self, name: str) -> tuple[str, str]:
        found = self._custom.get(name)
        if found is None:
            # kombu's public API tells a registered serializer's content type and encoding by use
            content_type, encoding, _ = kombu_dumps({}, serializer=name)
            found = self._custom[name] = (content_type, encoding)
        return found

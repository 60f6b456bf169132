"""The embedded transport: a queue in a local SQLite file, no server needed."""

from __future__ import annotations

from typing import ClassVar


class EmbeddedTransport:
    supports_async: ClassVar[bool] = False

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        return broker_url

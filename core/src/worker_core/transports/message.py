"""A message for kombu's virtual transports that survives headers of the wrong kind.

kombu reads ``headers.get('compression')`` while it builds a message, inside the transport and
before the worker sees it, so a message whose headers are a list (anything but a mapping) would
raise out of ``drain_events``. This message is built with empty headers and then given the ones
it came with, so the worker's decoder rejects it with a line that says what was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kombu.transport import virtual as _virtual

__all__ = ["Message"]

virtual: Any = _virtual


class Message(virtual.Message):  # type: ignore[misc]
    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        headers = payload.get("headers") if isinstance(payload, Mapping) else None
        if not headers or isinstance(headers, Mapping):
            super().__init__(payload, channel=channel, **kwargs)
            return
        super().__init__(dict(payload, headers={}), channel=channel, **kwargs)
        self._raw = payload  # restored as it came
        self.headers = headers

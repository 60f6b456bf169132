"""JSON exactly as kombu writes and reads it, on the C encoder/decoder when nothing needs kombu's
``{"__type__": ..., "__value__": ...}`` forms (dates, decimals, UUIDs, bytes)."""

from __future__ import annotations

import json
from typing import Any

from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

__all__ = ["dumps", "loads"]

_decode = json.JSONDecoder().decode
_encode = json.JSONEncoder(ensure_ascii=False).encode


def loads(data: str | bytes | bytearray | memoryview) -> Any:
    """Decode JSON text; kombu's object hook runs only if the text holds a ``__type__`` key."""
    if not isinstance(data, str):
        data = bytes(data).decode("utf-8")
    if '"__type__"' in data:
        return kombu_loads(data)
    return _decode(data)


def dumps(value: Any) -> str:
    """Encode to JSON; values plain JSON cannot hold go through kombu's encoder."""
    try:
        return _encode(value)
    except (TypeError, ValueError):
        return kombu_dumps(value)  # type: ignore[no-any-return]

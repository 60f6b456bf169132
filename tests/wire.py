"""Reading task messages as a broker holds them (a Redis list), and comparing two clients' messages
with ids and times replaced by placeholders: the n-th distinct id met becomes ``<id n>`` (so which
values are the same id is still compared; ids inside keys and other strings too), an ISO time
``<time>``."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

__all__ = ["messages_on", "normalized", "plain"]

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?$")


def messages_on(client: Any, queue: str) -> list[dict[str, Any]]:
    """Every message waiting in the Redis queue ``queue`` (its lists of every priority, each
    oldest first), each as ``{"headers",
    "properties", "content_type", "content_encoding", "body"}`` with the body decoded."""
    found = []
    # kombu keeps the messages of each priority step in a list of its own after the queue's
    lists = [queue, *(f"{queue}\x06\x16{step}" for step in (3, 6, 9))]
    raws = [raw for name in lists for raw in reversed(client.lrange(name, 0, -1))]  # LPUSH: newest first
    for raw in raws:
        envelope = json.loads(raw)
        properties = dict(envelope["properties"])
        body = base64.b64decode(envelope["body"]) if properties.pop("body_encoding", None) == "base64" else \
            envelope["body"].encode()
        found.append({
            "headers": envelope["headers"],
            "properties": properties,
            "content_type": envelope["content-type"],
            "content_encoding": envelope["content-encoding"],
            "body": json.loads(body),
        })
    return found


def plain(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples become lists, signatures plain dicts)."""
    from kombu.utils.json import dumps, loads

    return loads(dumps(value))


def normalized(value: Any, ids: dict[str, str] | None = None) -> Any:
    """``value`` with ids and times replaced, walking dicts in key order (so two values built in
    different key orders name their ids alike)."""
    ids = {} if ids is None else ids
    if isinstance(value, dict):
        return {normalized(key, ids): normalized(value[key], ids) for key in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [normalized(item, ids) for item in value]
    if isinstance(value, str):
        if _TIME.match(value):
            return "<time>"
        return _UUID.sub(lambda found: ids.setdefault(found.group(), f"<id {len(ids)}>"), value)
    return value

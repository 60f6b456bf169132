"""A compact bytes form for what a worker keeps of a message for a long time (a task held for its
ETA): marshal, then zlib with a preset dictionary of what every Celery message repeats (header
names, the empty canvas, the content type), so a countdown task's message packs into a few
hundred bytes. The bytes never leave the process that made them."""

from __future__ import annotations

import base64
import marshal
import zlib
from typing import Any

__all__ = ["PackError", "pack", "unpack"]


class PackError(ValueError):
    """The value holds something marshal cannot write (it is then kept as it is)."""


def _sample() -> bytes:
    """What a preset dictionary for Celery messages holds: one such message, as it is packed."""
    task_id = "00000000-0000-0000-0000-000000000000"
    body = b'[[], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'
    headers: dict[str, Any] = {
        "lang": "py", "task": "", "id": task_id, "shadow": None, "eta": "2000-01-01T00:00:00.000000+00:00",
        "expires": None, "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
        "root_id": task_id, "parent_id": None, "argsrepr": "()", "kwargsrepr": "{}", "origin": "gen0@",
        "ignore_result": False, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
    }
    properties = {"correlation_id": task_id, "reply_to": "", "delivery_mode": 2,
                  "delivery_info": {"exchange": "", "routing_key": "celery"}, "priority": 0,
                  "body_encoding": "base64", "delivery_tag": task_id}
    # a kombu virtual envelope (Redis, embedded) carries the body in base64, whose text depends on
    # where the canvas starts in it: the three alignments
    encoded = [base64.b64encode(b"x" * shift + body[7:]).decode()[4:] for shift in range(3)]
    envelope = {"body": "", "content-encoding": "utf-8", "content-type": "application/json",
                "headers": headers, "properties": properties}
    info = {"consumer_tag": "None4", "redelivered": False}
    return "".join(encoded).encode() + marshal.dumps((envelope, body, info))


_ZDICT = _sample()


def pack(value: Any) -> bytes:
    """``value`` (plain data: dicts, lists, tuples, text, bytes, numbers, None) as compact bytes.

    :raise PackError: ``value`` holds something else (a date, a decimal, an object).
    """
    try:
        data = marshal.dumps(value)
    except ValueError as exc:
        raise PackError(f"cannot pack {type(value).__name__}: {exc}") from None
    compressor = zlib.compressobj(6, zdict=_ZDICT)
    return compressor.compress(data) + compressor.flush()


def unpack(packed: bytes) -> Any:
    """The value :func:`pack` made ``packed`` of (a fresh copy at each call)."""
    decompressor = zlib.decompressobj(zdict=_ZDICT)
    return marshal.loads(decompressor.decompress(packed) + decompressor.flush())

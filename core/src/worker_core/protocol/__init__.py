"""Celery's message protocol v2: building, decoding and the dates it carries, and what a
broker-side delay leaves on a routing key.

Public (see :mod:`worker_core`), with :mod:`.fastjson` and :mod:`.packing`; its other modules are
internal.
"""

from .decode import JSON, TaskEnvelope, decode_task
from .delays import DELAY_LEVELS, DELIVERY_EXCHANGE, strip_delay
from .headers import LOST_HEADER, custom_headers
from .message import OutgoingMessage, origin_name, safe_repr, safe_repr_as_built, shown, task_message
from .times import parse_iso, to_iso, utcnow

__all__ = [
    "DELAY_LEVELS",
    "DELIVERY_EXCHANGE",
    "JSON",
    "LOST_HEADER",
    "OutgoingMessage",
    "TaskEnvelope",
    "custom_headers",
    "decode_task",
    "origin_name",
    "parse_iso",
    "safe_repr",
    "safe_repr_as_built",
    "shown",
    "strip_delay",
    "task_message",
    "to_iso",
    "utcnow",
]

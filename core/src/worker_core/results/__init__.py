"""Result backends: the stored format, and the embedded and disabled backends.

Public (see :mod:`worker_core`): the task states, Celery's stored format (:func:`make_meta`,
:func:`pending_meta`, the exception encoding) and :class:`ResultCodec` (the result serializers),
for a result backend of one's own; :class:`Outcome`, what became of a task, and
:func:`store_outcome`, the one way the worker stores it. The backends themselves are internal.
"""

from typing import TYPE_CHECKING, Any

from .meta import (
    EXCEPTION_STATES,
    FAILURE,
    IGNORED,
    PENDING,
    PROPAGATE_STATES,
    READY_STATES,
    RECEIVED,
    REJECTED,
    RETRY,
    REVOKED,
    STARTED,
    SUCCESS,
    UNREADY_STATES,
    decode_exception,
    decode_result,
    encode_exception,
    make_meta,
    pending_meta,
)
from .outcome import Outcome, store_outcome

if TYPE_CHECKING:
    from .codec import ResultCodec

__all__ = [
    "EXCEPTION_STATES",
    "FAILURE",
    "IGNORED",
    "PENDING",
    "PROPAGATE_STATES",
    "READY_STATES",
    "RECEIVED",
    "REJECTED",
    "RETRY",
    "REVOKED",
    "STARTED",
    "SUCCESS",
    "UNREADY_STATES",
    "Outcome",
    "ResultCodec",
    "decode_exception",
    "decode_result",
    "encode_exception",
    "make_meta",
    "pending_meta",
    "store_outcome",
]


def __getattr__(name: str) -> Any:
    # the codec imports kombu's serializers: only for who asks for it
    if name == "ResultCodec":
        from .codec import ResultCodec

        return ResultCodec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

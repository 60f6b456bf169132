"""Refusing a message the worker cannot honour: one log line, the message taken off its queue
(to the dead-letter queue when there is one), and its result failed with the reason, so a
client waiting on it gets the error at once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..exceptions import DecodeError, ProtocolError
from ..protocol import safe_repr
from ..results.meta import FAILURE
from ..results.outcome import Outcome, store_outcome
from ..slots import DiscardsResults

if TYPE_CHECKING:
    from kombu.message import Message

    from ..app.base import App

__all__ = ["Refuser", "describe_message"]

logger = logging.getLogger("worker.consumer")

#: how much of a reason a log line and a stored result carry
REASON_MAX = 500


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def identify(message: Any) -> tuple[str | None, str | None]:
    """The task id and name a message claims, from its headers (protocol v2) or its
    ``correlation_id`` property (which Celery sets to the task id); None for what it lacks."""
    headers = getattr(message, "headers", None)
    headers = headers if isinstance(headers, Mapping) else {}
    properties = getattr(message, "properties", None)
    properties = properties if isinstance(properties, Mapping) else {}
    return _text(headers.get("id")) or _text(properties.get("correlation_id")), _text(headers.get("task"))


def describe_message(message: Any) -> str:
    """Name a message for a log line without trusting its contents: the task and id it claims
    (or its delivery tag) and the queue it came from."""
    task_id, name = identify(message)
    info = getattr(message, "delivery_info", None)
    queue = info.get("routing_key") if isinstance(info, Mapping) else None
    if task_id is not None:
        named = f"{safe_repr(name or '?', 120)}[{safe_repr(task_id, 60)}]"
    else:
        named = f"delivery {safe_repr(getattr(message, 'delivery_tag', None), 60)}"
    return f"{named} from queue {safe_repr(queue, 60)}"


class Refuser:
    """Refuses the messages of one consumer: says so to the hooks, takes each off its queue with
    ``dead_letter(message, reason)``, stores its failure in ``app``'s result backend."""

    def __init__(self, app: App, notify: Callable[..., None],
                 dead_letter: Callable[[Message, str], None]) -> None:
        self.app = app
        self.notify = notify
        self.dead_letter = dead_letter

    def refuse(self, message: Message, error: BaseException, stored: BaseException | None = None) -> None:
        """Take ``message`` off its queue for good (it is not requeued: it would only be refused
        again) to the dead-letter queue when there is one, say why in one line, and store its
        result as FAILURE with ``stored`` (else ``error``) when it names a task id and results
        are kept. Never raises."""
        reason = _one_line(str(error) or type(error).__name__)
        logger.error("Rejected message %s: %s", describe_message(message), reason)
        self.notify("task_rejected", request=None, reason=reason, requeue=False)
        self.dead_letter(message, reason)
        self._fail_result(message, error if stored is None else stored)

    def refuse_undecodable(self, message: Message, exc: BaseException) -> None:
        """kombu's decode-error callback: the transport or kombu could not build the message (the
        transport's reason is a :class:`ProtocolError`; kombu's own, such as a compression it
        cannot undo, is given as a decode error)."""
        if not isinstance(exc, ProtocolError):
            exc = DecodeError(f"kombu cannot decode it: {type(exc).__name__}: {exc}")
        self.refuse(message, exc)

    def _fail_result(self, message: Any, error: BaseException) -> None:
        task_id, name = identify(message)
        headers = getattr(message, "headers", None)
        if task_id is None or (isinstance(headers, Mapping) and headers.get("ignore_result") is True):
            return
        backend = self.app.backend
        if isinstance(backend, DiscardsResults) and backend.discards_results:
            return
        request: dict[str, Any] = {"task": name}
        properties = getattr(message, "properties", None)
        if isinstance(properties, Mapping):
            # where a result backend replying to the sender (rpc://) sends the failure, as Celery's worker
            for key in ("reply_to", "correlation_id"):
                value = _text(properties.get(key))
                if value:
                    request[key] = value
        try:
            store_outcome(backend, Outcome(FAILURE, exception=error, task_id=task_id, request=request))
        except Exception as exc:
            logger.error("Could not store the failure of refused message %s: %s: %s",
                         describe_message(message), type(exc).__name__, exc)

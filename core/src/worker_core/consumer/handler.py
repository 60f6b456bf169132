"""Turning a raw broker message into a :class:`Request`, or rejecting it with one log line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kombu.serialization import prepare_accept_content

from ..exceptions import NotRegistered, ProtocolError
from ..options import did_you_mean
from ..protocol import decode_task, safe_repr
from ..request import Request
from ..results.meta import FAILURE, encode_exception

if TYPE_CHECKING:
    from kombu.message import Message

    from .consumer import Consumer

__all__ = ["describe_message", "make_handler"]

logger = logging.getLogger("worker.consumer")


def describe_message(message: Any) -> str:
    """Name a message for a log line without trusting its contents."""
    headers = getattr(message, "headers", None)
    if isinstance(headers, dict):
        name, task_id = headers.get("task"), headers.get("id")
        if isinstance(name, str) and isinstance(task_id, str):
            return f"{safe_repr(name, 120)}[{safe_repr(task_id, 60)}]"
    info = getattr(message, "delivery_info", None) or {}
    tag = getattr(message, "delivery_tag", None)
    return f"delivery {safe_repr(tag, 60)} from queue {safe_repr(info.get('routing_key'), 60)}"


def make_handler(consumer: Consumer) -> Callable[[Message], None]:
    """The ``on_message`` callback: decode, look the task up, hand a Request to the consumer."""
    settings = consumer.app.settings
    accept = frozenset(prepare_accept_content(list(settings.accept_content)))
    max_size = settings.worker_max_message_size
    tasks = consumer.app.tasks

    def on_message(message: Message) -> None:
        try:
            envelope = decode_task(
                message.headers, message.properties, message.body, message.content_type,
                message.content_encoding, accept=accept, max_size=max_size,
            )
        except ProtocolError as exc:
            reject_invalid(consumer, message, str(exc))
            return
        except Exception as exc:  # anything else a hostile message can provoke
            reject_invalid(consumer, message, f"cannot be read: {type(exc).__name__}: {exc}")
            return
        task = tasks.get(envelope.name)
        if task is None:
            reject_unknown(consumer, message, envelope.name, envelope.id)
            return
        try:
            consumer.receive(Request(consumer, message, envelope, task))
        except Exception:
            logger.critical("Rejected message %s: internal error while receiving it",
                            describe_message(message), exc_info=True)
            consumer.reject(message, requeue=False)

    return on_message


def reject_invalid(consumer: Consumer, message: Message, reason: str) -> None:
    logger.error("Rejected message %s: %s", describe_message(message), reason)
    consumer.notify("task_rejected", request=None, reason=reason, requeue=False)
    consumer.reject(message, requeue=False)


def reject_unknown(consumer: Consumer, message: Message, name: str, task_id: str) -> None:
    known = sorted(consumer.app.tasks)
    shown = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
    reason = (
        f"unknown task {name!r}: this worker has no task of that name.{did_you_mean(name, known)} "
        f"Registered: {shown or 'none'}"
    )
    logger.error("Rejected message %s: %s", describe_message(message), reason)
    consumer.notify("task_rejected", request=None, reason=reason, requeue=False)
    consumer.reject(message, requeue=False)
    try:
        consumer.app.backend.store_result(
            task_id, encode_exception(NotRegistered(name)), FAILURE, None, {"task": name}
        )
    except Exception:
        logger.exception("could not store the failure of unknown task %s[%s]", name, task_id)

"""Declaring a queue the worker consumes, each try on a channel of its own so a refusal never
closes the channel that consumes. A queue that exists with other arguments (a quorum queue, a
priority queue, a dead-letter exchange, ...) is adopted as it is, in one log line naming the
queue, the argument, both values and the setting to change; an exchange of another type, or a
stream, is refused in one line."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs

from worker_core.exceptions import TopologyError

from .inequivalent import FLAGS, Mismatch, mismatch_of
from .inequivalent import MISSING as _MISSING

if TYPE_CHECKING:
    from kombu.connection import Connection

#: kombu's queue, untyped there
Queue = Any

__all__ = ["Declared", "declare_queue"]

logger = logging.getLogger("worker.consumer")

#: the broker's codes for a declaration refused for good: access refused, not found (a passive
#: declaration, a missing exchange to bind to), precondition failed (an argument it does not take)
_REFUSALS = frozenset({403, 404, 406})

#: more tries than a queue has arguments RabbitMQ compares
_MAX_TRIES = 16


@attrs.frozen
class Declared:
    """A queue as it exists on the broker, and what differed from what this worker wanted."""

    queue: Queue
    adopted: tuple[Mismatch, ...] = ()


def _code(exc: BaseException) -> Any:
    return getattr(exc, "reply_code", None) or getattr(exc, "code", None)


def _shown(value: Any) -> str:
    return "none" if value is _MISSING else repr(value)


def setting_for(argument: str) -> str:
    """The setting that makes this worker declare ``argument`` as the broker has it."""
    if argument == "x-queue-type":
        return "the queue's queue_type in task_queues (task_default_queue_type for the default queue)"
    if argument == "x-max-priority":
        return "the queue's max_priority in task_queues, or task_queue_max_priority"
    if argument in FLAGS:
        return f"the queue's {argument} in task_queues"
    return f"the queue's queue_arguments in task_queues ({argument!r})"


def _adopting(queue: Queue, mismatch: Mismatch) -> Queue:
    copy: Queue = queue.__copy__()
    if mismatch.argument in FLAGS:
        setattr(copy, mismatch.argument, bool(mismatch.current))
        return copy
    arguments = dict(copy.queue_arguments or {})
    if mismatch.current is _MISSING:
        arguments.pop(mismatch.argument, None)
    else:
        arguments[mismatch.argument] = mismatch.current
    copy.queue_arguments = arguments or None
    return copy


def _refusal(queue: Queue, mismatch: Mismatch) -> TopologyError:
    if mismatch.kind == "exchange":
        return TopologyError(
            f"exchange {mismatch.name!r} (of queue {queue.name!r}) exists on the broker with "
            f"{mismatch.argument}={_shown(mismatch.current)}, but this worker declares "
            f"{mismatch.argument}={_shown(mismatch.received)}: "
            f"change the exchange in task_queues to match, or delete the exchange if nothing else uses it"
        )
    return TopologyError(
        f"queue {queue.name!r} exists on the broker with {mismatch.argument}={_shown(mismatch.current)}, "
        f"which this worker cannot consume as a task queue (it declares {_shown(mismatch.received)}): "
        f"consume another queue, "
        f"or set {setting_for(mismatch.argument)}"
    )


def _safe(mismatch: Mismatch) -> bool:
    """Consuming the queue as the broker has it is safe unless it is a stream (read by offset, not
    acknowledged away) or the difference is an exchange's (its routing would change)."""
    if mismatch.kind != "queue":
        return False
    return not (mismatch.argument == "x-queue-type" and mismatch.current == "stream")


def _close(channel: Any) -> None:
    try:
        channel.close()
    except Exception as exc:  # already closed by the broker's refusal
        logger.debug("closing a declaring channel: %r", exc)


def declare_queue(connection: Connection, queue: Queue) -> Declared:
    """Declare ``queue`` (its exchange, the queue, its bindings), adopting the arguments of a
    queue that exists with others where that is safe.

    :raise TopologyError: the queue or its exchange exists in a way this worker cannot adopt.
    """
    current = queue
    adopted: list[Mismatch] = []
    for _ in range(_MAX_TRIES):
        channel = connection.channel()
        try:
            current(channel).declare()
        except Exception as exc:
            mismatch = mismatch_of(exc)
            if mismatch is None:
                if _code(exc) in _REFUSALS:  # refused for good: a retry would only be refused again
                    raise TopologyError(
                        f"queue {queue.name!r}: the broker refused its declaration ({exc}); change the queue "
                        f"in task_queues, or the broker user's permissions") from None
                raise
            if not _safe(mismatch):
                raise _refusal(queue, mismatch) from None
            adopted.append(mismatch)
            current = _adopting(current, mismatch)
            continue
        finally:
            _close(channel)
        for mismatch in adopted:
            logger.warning(
                "Queue %r exists on the broker with %s=%s where this worker declares %s: consuming it "
                "as it is "
                "(to declare it so, set %s)",
                queue.name,
                mismatch.argument,
                _shown(mismatch.current),
                _shown(mismatch.received),
                setting_for(mismatch.argument),
            )
        return Declared(current, tuple(adopted))
    raise TopologyError(
        f"queue {queue.name!r}: the broker kept refusing its declaration after adopting "
        f"{', '.join(m.argument for m in adopted)}; declare it as it exists in task_queues"
    )

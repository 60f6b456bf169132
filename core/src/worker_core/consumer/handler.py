"""Turning a raw broker message into a :class:`Request`, or refusing it (see :mod:`.refusal`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kombu.serialization import prepare_accept_content

from ..app.builtins import builtin_names
from ..exceptions import NotRegistered, ProtocolError
from ..options import did_you_mean
from ..protocol import decode_task, shown
from ..protocol.headers import DELIVERY_COUNT, LOST_HEADER
from ..request import Request
from ..slots import ForeignApp

if TYPE_CHECKING:
    from kombu.message import Message

    from ..app.base import App
    from .eta import MakeRequest
    from .poison import PoisonCap
    from .refusal import Refuser
    from .reservations import Reservations
    from .tasks import TaskConsumer

__all__ = ["accepted", "make_handler", "request_class"]

logger = logging.getLogger("worker.consumer")


def accepted(app: App) -> frozenset[str]:
    """The content types the worker decodes (``accept_content``)."""
    return frozenset(prepare_accept_content(list(app.settings.accept_content)))


def request_class(app: App) -> Callable[..., Request]:
    """What builds a request: an app loader's app runs its tasks its own way."""
    return app.request_class if isinstance(app, ForeignApp) else Request


def make_handler(app: App, *, make_request: MakeRequest, tasks: TaskConsumer, reservations: Reservations,
                 poison: PoisonCap, refuser: Refuser) -> Callable[[Message], None]:
    """The ``on_message`` callback: decode, look the task up with ``app``, build a Request with
    ``make_request(message, envelope, task)`` and hand it to the ``reservations``."""
    settings = app.settings
    accept = accepted(app)
    max_size = settings.worker_max_message_size
    registered = app.tasks
    limit = settings.worker_redelivery_limit
    counted = tasks
    fence = reservations.fence
    refuse = refuser.refuse

    def on_message(message: Message) -> None:
        counted.delivered += 1
        try:
            envelope = decode_task(
                message.headers, message.properties, message.body, message.content_type,
                message.content_encoding, accept=accept, max_size=max_size,
            )
        except ProtocolError as exc:
            refuse(message, exc)
            return
        except Exception as exc:  # anything else a hostile message can provoke
            refuse(message, ProtocolError(f"cannot be read: {type(exc).__name__}: {exc}"))
            return
        task = registered.get(envelope.name)
        if task is None:
            # stored as Celery stores it: NotRegistered(name)
            refuse(message, unknown_task(app, envelope.name), NotRegistered(envelope.name))
            return
        headers = envelope.headers
        try:
            request = make_request(message, envelope, task)
            if fence.ran and fence.is_copy(request):
                return
            if limit is not None:
                # the poison cap: only a message delivered again, or carrying a count, costs more
                info = message.delivery_info
                if (info and info.get("redelivered")) or LOST_HEADER in headers or DELIVERY_COUNT in headers:
                    poisoned = poison.on_arrival(request)
                    if poisoned is not None:
                        request.fail_as_poison(poisoned)
                        reservations.task_done(request, started=False)
                        return
            reservations.receive(request)
        except Exception as exc:
            logger.critical("Internal error while receiving %s[%s]", shown(envelope.name),
                            shown(envelope.id, 100), exc_info=True)
            reason = f"internal error while receiving it: {type(exc).__name__}: {exc}"
            refuse(message, ProtocolError(reason))

    return on_message


def unknown_task(app: App, name: str) -> NotRegistered:
    """The error for a message naming a task this worker does not have, with the closest names."""
    known = builtin_names(app.tasks, builtins=False)  # Celery's built-ins go unsaid
    shown = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
    return NotRegistered(
        f"unknown task {name!r}: this worker has no task of that name.{did_you_mean(name, known)} "
        f"Registered: {shown or 'none'}"
    )

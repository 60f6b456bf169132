"""The mailbox every worker and client shares: Celery's names, so ``celery inspect`` reaches us."""

from __future__ import annotations

from typing import Any

__all__ = ["NAMESPACE", "SENDER_HEADER", "mailbox"]

NAMESPACE = "celery"  # exchange celery.pidbox, node queues <hostname>.celery.pidbox
QUEUE_TTL = 300.0  # seconds a request may wait in a node's queue (Celery's control_queue_ttl)
QUEUE_EXPIRES = 10.0  # seconds an unused node queue lives on (Celery's control_queue_expires)
#: the header in which this project's clients name themselves (as a task message's does); kombu's
#: pidbox neither sends nor reads it, so Celery's workers pass over it and Celery's clients send none
SENDER_HEADER = "origin"


def mailbox() -> Any:
    from kombu.pidbox import Mailbox

    return Mailbox(
        NAMESPACE, type="fanout", accept=["json"], queue_ttl=QUEUE_TTL, reply_queue_ttl=QUEUE_TTL,
        queue_expires=QUEUE_EXPIRES, reply_queue_expires=QUEUE_EXPIRES,
    )

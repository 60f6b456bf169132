"""The mailbox every worker and client shares: Celery's names, so ``celery inspect`` reaches us."""

from __future__ import annotations

from typing import Any

__all__ = ["NAMESPACE", "mailbox"]

NAMESPACE = "celery"  # exchange celery.pidbox, node queues <hostname>.celery.pidbox
QUEUE_TTL = 300.0  # seconds a request may wait in a node's queue (Celery's control_queue_ttl)
QUEUE_EXPIRES = 10.0  # seconds an unused node queue lives on (Celery's control_queue_expires)


def mailbox() -> Any:
    from kombu.pidbox import Mailbox

    return Mailbox(
        NAMESPACE, type="fanout", accept=["json"], queue_ttl=QUEUE_TTL, reply_queue_ttl=QUEUE_TTL,
        queue_expires=QUEUE_EXPIRES, reply_queue_expires=QUEUE_EXPIRES,
    )

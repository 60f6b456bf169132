"""Sending a command to workers and collecting their replies (``workerctl inspect/control``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..app.broker import connection_for
from .mailbox import mailbox

if TYPE_CHECKING:
    from ..app.base import App

__all__ = ["broadcast"]


def broadcast(app: App, command: str, arguments: dict[str, Any] | None = None,
              destination: Sequence[str] | None = None, timeout: float = 1.0,
              reply: bool = True, limit: int | None = None) -> list[dict[str, Any]]:
    """Send ``command`` to every worker (or only ``destination``) and return the replies,
    each ``{hostname: reply}``, received within ``timeout`` seconds or until ``limit`` came
    (none without ``reply``)."""
    with connection_for(app.plugins, app.broker_urls[0], app.settings) as connection:
        bound = mailbox()(connection)
        replies = bound._broadcast(command, arguments or {}, list(destination) if destination else None,
                                   reply=reply, timeout=timeout, limit=limit)
        return list(replies or [])

"""The worker's end of remote control: a pidbox node on its own channel, answering commands in
the event loop's thread; a malformed request gets a log line, never an exception."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..options import did_you_mean
from .commands import Command
from .mailbox import mailbox

if TYPE_CHECKING:
    from ..worker.worker import Worker

__all__ = ["ControlNode"]

logger = logging.getLogger("worker.control")


class _Handlers(dict[str, Any]):
    """kombu looks handlers up by name; an unknown name answers with the known ones."""

    def __missing__(self, name: str) -> Any:
        known = sorted(self)

        def unknown(_state: Any, **_arguments: Any) -> dict[str, str]:
            return {
                "error": f"unknown command {name!r}.{did_you_mean(name, known)} Known: {', '.join(known)}"
            }

        return unknown


class ControlNode:
    """Listens on ``<hostname>.celery.pidbox`` (bound to the ``celery.pidbox`` fanout exchange)."""

    def __init__(self, worker: Worker, connection: Any, commands: Mapping[str, Command]) -> None:
        self.worker = worker
        self.channel = connection.channel()
        handlers = _Handlers({name: command.handler for name, command in commands.items()})
        self.node = mailbox()(connection).Node(worker.hostname, state=worker, channel=self.channel,
                                               handlers=handlers)
        self.consumer = self.node.listen(callback=self.on_message)

    def on_message(self, body: Any, message: Any) -> None:
        if not isinstance(body, dict):
            logger.error("Rejected control message: the body must be an object (got %s)", type(body).__name__)
            return
        method, arguments = body.get("method"), body.get("arguments") or {}
        if not isinstance(method, str) or not isinstance(arguments, dict):
            logger.error("Rejected control message: 'method' must be a string and 'arguments' an object "
                         "(got %r and %r)", method, type(arguments).__name__)
            return
        destination = body.get("destination")
        if destination is not None and not isinstance(destination, (list, tuple)):
            logger.error("Rejected control message: 'destination' must be a list of node names (got %r)",
                         destination)
            return
        logger.debug("control command %s %r", method, arguments)
        try:
            self.node.handle_message(body, message)
        except Exception:
            logger.exception("control command %r failed", method)

    def close(self) -> None:
        try:
            self.consumer.cancel()
        except Exception as exc:
            logger.debug("error cancelling the control consumer: %r", exc)
        try:
            self.channel.close()
        except Exception as exc:
            logger.debug("error closing the control channel: %r", exc)

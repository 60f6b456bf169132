"""The worker's end of remote control: a pidbox node on its own channel, answering the commands
allowed in the event loop's thread, with an audit line for each that changes the worker; a
malformed request gets a log line, never an exception."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..options import did_you_mean
from .access import Access
from .audit import log_command, log_inspect, log_refused, sender_of
from .command import ControlCommand as Command
from .mailbox import mailbox

if TYPE_CHECKING:
    from ..worker.worker import Worker

__all__ = ["ControlNode", "start_node"]

logger = logging.getLogger("worker.control")

#: seconds between tries to take the node's queue back from another connection
RETRY_SECONDS = 10.0


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

    def __init__(self, worker: Worker, connection: Any, commands: Mapping[str, Command],
                 access: Access) -> None:
        self.worker = worker
        self.access = access
        #: who sent the message being handled (kombu calls the handlers with the worker only)
        self._sender = ""
        self.channel = connection.channel()
        handlers = _Handlers({name: self._handler(command) for name, command in commands.items()})
        self.node = mailbox()(connection).Node(worker.hostname, state=worker, channel=self.channel,
                                               handlers=handlers)
        self.consumer = self.node.listen(callback=self.on_message)

    def _handler(self, command: Command) -> Any:
        def handle(worker: Worker, **arguments: Any) -> Any:
            if not self.access.permits(command.name):
                log_refused(command.name, arguments, self._sender)
                return {"error": self.access.refusal(command)}
            if command.kind == "control":
                log_command(command.name, arguments, self._sender)
            else:
                log_inspect(command.name, arguments, self._sender)
            return command.handler(worker, **arguments)

        return handle

    def on_message(self, body: Any, message: Any) -> None:
        # as Celery's worker: every request moves the clock on (clients keep no clock to adjust to)
        self.worker.clock.forward()
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
        self._sender = sender_of(body, message)
        try:
            self.node.handle_message(body, message)
        except Exception:
            logger.exception("control command %r failed", method)
        finally:
            self._sender = ""

    def close(self) -> None:
        try:
            self.consumer.cancel()
        except Exception as exc:
            logger.debug("error cancelling the control consumer: %r", exc)
        try:
            self.channel.close()
        except Exception as exc:
            logger.debug("error closing the control channel: %r", exc)


def start_node(worker: Worker, connection: Any, *, announce: bool, quiet: bool = False) -> ControlNode | None:
    """The worker's node, answering the commands ``worker_remote_control_allow`` allows (None when
    another connection holds the node's queue: a worker of the same name, or this one's old
    connection that the broker has not closed yet). ``announce`` logs which commands, at the
    first start; ``quiet`` says nothing when the queue is held (a retry).

    :raise ConfigurationError: the setting names a command that does not exist.
    """
    from kombu.exceptions import InconsistencyError

    commands = worker.control_commands()
    access = Access.from_setting(worker.app.settings.worker_remote_control_allow, commands)
    if announce and access.allow is not None:
        logger.info("Remote control answers %s (worker_remote_control_allow)", access.summary())
    try:
        return ControlNode(worker, connection, commands, access)
    except InconsistencyError:
        if not quiet:
            logger.error(
                "Remote control is off for this worker: another worker named %s already listens on "
                "this broker. Give each worker a unique name with -n NAME@%%h (tried again every %g s: "
                "a restarted worker's old connection may not be closed yet)", worker.hostname, RETRY_SECONDS,
            )
        return None

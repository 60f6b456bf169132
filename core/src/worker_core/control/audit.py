"""Who sent a control message, and the log line left by every command that changes the worker.

The sender is what the message says: this project's clients name themselves in a header, Celery's
name nobody, so only their reply queue is known. Anyone who can publish to the broker can claim
any name; the line records the claim, it does not prove it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..protocol import safe_repr
from ..redaction import redact_value
from .mailbox import SENDER_HEADER

__all__ = ["ROUTINE", "log_command", "log_inspect", "log_refused", "sender_of"]

logger = logging.getLogger("worker.control")

ARGUMENTS_MAXSIZE = 512
#: commands monitors send on a timer (Flower's enable_events every few seconds): logged at DEBUG,
#: like every inspect command, so a day's log is not thousands of them
ROUTINE = frozenset({"enable_events", "disable_events", "heartbeat"})
NAME_MAXSIZE = 200


def _shown(text: str) -> str:
    # A name from the wire goes into a log line: no line breaks or escapes, bounded.
    return text if text.isprintable() and len(text) <= NAME_MAXSIZE else safe_repr(text, NAME_MAXSIZE)


def sender_of(body: Mapping[str, Any], message: Any) -> str:
    """The sender as a log line shows it: the name it gave, else what can be known of it."""
    headers = getattr(message, "headers", None) or {}
    name = headers.get(SENDER_HEADER) if isinstance(headers, Mapping) else None
    if isinstance(name, str) and name.strip():
        return _shown(name.strip())
    reply_to = body.get("reply_to")
    if isinstance(reply_to, Mapping) and reply_to.get("routing_key"):
        queue = f"{reply_to.get('routing_key')}.{reply_to.get('exchange')}"
        return f"unknown: it did not name itself; its reply queue is {_shown(queue)}"
    return "unknown: it did not name itself and asked for no reply"


def _arguments(arguments: Mapping[str, Any]) -> str:
    # A plugin's command may take a password or a URL: shown as settings are, bounded.
    return safe_repr(redact_value("arguments", dict(arguments)), ARGUMENTS_MAXSIZE)


def log_command(name: str, arguments: Mapping[str, Any], sender: str) -> None:
    """The audit line of a command that changes the worker, logged before it runs."""
    if name == "shutdown":
        extra = f": {_arguments(arguments)}" if arguments else ""
        logger.warning("Got shutdown from remote (sender %s)%s", sender, extra)
        return
    level = logging.DEBUG if name in ROUTINE else logging.INFO
    logger.log(level, "Remote control: %s %s (sender %s)", name, _arguments(arguments), sender)


def log_inspect(name: str, arguments: Mapping[str, Any], sender: str) -> None:
    """The DEBUG line of a command that only reads (``ping``, ``stats``, ...)."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("Remote control: %s %s (sender %s)", name, _arguments(arguments), sender)


def log_refused(name: str, arguments: Mapping[str, Any], sender: str) -> None:
    logger.warning("Refused remote control command %s %s (sender %s): worker_remote_control_allow does "
                   "not allow it", name, _arguments(arguments), sender)

"""systemd's notification protocol (``sd_notify``), without libsystemd: datagrams to the socket
``NOTIFY_SOCKET`` names, when systemd runs the worker as a ``Type=notify`` service.

``READY=1`` once the worker has started (its consumer begun, connected or retrying: a broker that
is down must not fail the unit's start), ``STATUS=`` with the readiness reason when it changes,
``WATCHDOG=1`` while the main loop makes progress (``WatchdogSec=``), ``STOPPING=1`` when a stop
begins.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["Notifier"]

logger = logging.getLogger("worker.health")


class Notifier:
    """Sends to ``$NOTIFY_SOCKET``; does nothing when it is not set."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        environ = dict(os.environ) if environ is None else environ
        address = environ.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if address.startswith("@"):  # an abstract socket: a NUL byte before its name
            self.address = "\0" + address[1:]
        elif address.startswith("/"):
            self.address = address
        #: seconds between watchdog pings (half of WatchdogSec), None without a watchdog
        self.watchdog_interval: float | None = None
        usec = environ.get("WATCHDOG_USEC", "")
        watchdog_pid = environ.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not watchdog_pid or watchdog_pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 2_000_000
        self._socket: socket.socket | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> None:
        if self.address is None or self._failed:
            return
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            self._failed = True  # once: systemd went away, or the variable was inherited by mistake
            logger.warning("Cannot notify systemd through NOTIFY_SOCKET=%s: %s; not trying again",
                           self.address.replace("\0", "@"), exc)

    def close(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()

"""How many messages wait in the broker on the worker's queues, through the transport plugin.

Uses a connection of its own (one per thread), so an autoscaler may ask from its thread or from
the event loop without touching the consumer's connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from ..app.broker import connection_for, transport_for
from ..app.settings import Settings
from ..options import WorkerOptions
from ..plugins.manager import PluginManager

__all__ = ["Backlog"]

logger = logging.getLogger("worker.consumer")


class Backlog:
    def __init__(self, plugins: PluginManager, settings: Settings, options: WorkerOptions,
                 queues: Sequence[str] | None = None) -> None:
        self.plugins = plugins
        self.settings = settings
        #: the worker's list of queues (it changes with add_consumer/cancel_consumer)
        self.queues = options.queues if queues is None else queues
        self.url = options.brokers[0]
        self._local = threading.local()

    def depth(self) -> int:
        """Messages waiting (0 when the broker cannot be asked right now)."""
        local = self._local
        try:
            if getattr(local, "connection", None) is None:
                local.transport = transport_for(self.plugins, self.url, self.settings)
                local.connection = connection_for(self.plugins, self.url, self.settings)
            return sum(int(local.transport.queue_depth(local.connection, queue)) for queue in self.queues)
        except Exception as exc:
            logger.debug("could not read the queue depth: %r", exc)
            self.close()
            return 0

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            try:
                connection.release()
            except Exception:
                pass

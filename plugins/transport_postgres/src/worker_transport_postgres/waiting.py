"""Waiting for results on ``LISTEN``: one connection and one thread per process listen on
``"<schema>.celery_taskmeta"``, where a trigger notifies each task id that reaches a ready state
(whoever stores it: this worker, or a Celery worker on Celery's database backend), and wake the
threads waiting for that id. A waiter reads the row after its id is watched and the connection
listens, so a result stored at any moment is either read or notified; after the listening
connection was lost and made again, every waiter reads once more."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Hashable

from .database import connect, connection_errors

__all__ = ["ResultListener", "listener_for"]

logger = logging.getLogger(__name__)

#: Seconds between attempts to listen again after the connection was lost.
RETRY = 0.5


class ResultListener:
    """The process's listening connection for one results schema."""

    def __init__(self, conninfo: str, channel: str) -> None:
        self.conninfo = conninfo
        self.channel = channel
        self._lock = threading.Lock()
        self._waiting: dict[str, set[threading.Event]] = {}
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="postgres-results", daemon=True)
                self._thread.start()

    def watch(self, task_id: str, timeout: float) -> threading.Event:
        """An event set whenever ``task_id`` is notified (or the listening connection was made
        again); returns once the connection listens, or after ``timeout``."""
        event = threading.Event()
        with self._lock:
            self._waiting.setdefault(task_id, set()).add(event)
        self.start()
        self._listening.wait(timeout)
        return event

    def unwatch(self, task_id: str, event: threading.Event) -> None:
        with self._lock:
            events = self._waiting.get(task_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiting[task_id]

    def _wake_all(self) -> None:
        with self._lock:
            events = [event for events in self._waiting.values() for event in events]
        for event in events:
            event.set()

    def _run(self) -> None:
        failing = False
        while not self._stopping:
            connection = None
            try:
                connection = connect(self.conninfo, role="results", prepare_threshold=None)
                connection.execute(f'LISTEN "{self.channel}"')
                self._listening.set()
                if failing:
                    logger.warning("Listening for results in PostgreSQL again")
                    failing = False
                self._wake_all()  # what was stored while nothing listened is read again
                while not self._stopping:
                    for note in connection.notifies(timeout=1.0):
                        with self._lock:
                            events = list(self._waiting.get(note.payload, ()))
                        for event in events:
                            event.set()
            except connection_errors() as exc:
                self._listening.clear()
                if not failing:
                    failing = True
                    logger.warning(
                        "Lost the connection that listens for results in PostgreSQL (%s); "
                        "connecting again every %gs",
                        str(exc).strip(),
                        RETRY,
                    )
                self._wake_all()
                time.sleep(RETRY)
            finally:
                if connection is not None:
                    try:
                        connection.close()
                    except Exception:
                        pass

    def stop(self) -> None:
        self._stopping = True


_listeners: dict[Hashable, ResultListener] = {}
_listeners_lock = threading.Lock()


def _forget_after_fork() -> None:
    global _listeners_lock
    _listeners.clear()
    _listeners_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def listener_for(conninfo: str, channel: str) -> ResultListener:
    with _listeners_lock:
        found = _listeners.get((conninfo, channel))
        if found is None:
            found = _listeners[(conninfo, channel)] = ResultListener(conninfo, channel)
        return found

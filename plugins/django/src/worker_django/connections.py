"""Django's database connections in a worker, handled as Django handles them around a request:
the old or broken ones closed before and after each task (``CONN_MAX_AGE``, ``CONN_HEALTH_CHECKS``),
none held by the worker's main process when it forks its pool, and none a child inherited ever
used or closed (closing one would end the parent's session on the server)."""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["around_task", "close_all", "forget_inherited"]

logger = logging.getLogger("worker.django")

#: the driver connections a forked child inherited: kept referenced, never closed by the child
_inherited: list[Any] = []


def around_task() -> None:
    """Before and after each task, as Django does at a request's start and end: the queries
    DEBUG records are dropped, and the connections past ``CONN_MAX_AGE`` or unusable closed."""
    from django.db import close_old_connections, reset_queries

    reset_queries()
    close_old_connections()


def close_all() -> None:
    """Close every connection of this thread (the main process, before its pool forks; an
    executor, as it ends)."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        try:
            connection.close()
        except Exception as exc:  # a connection already broken: nothing to close
            logger.debug("closing the database connection %r: %r", connection.alias, exc)


def forget_inherited() -> None:
    """In a forked child: drop every connection it inherited without a word on its socket (the
    child's copy of the descriptor is closed; the driver's object is kept so that nothing ever
    finalises it), so the child opens its own and the parent's session lives on."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        driver = connection.connection
        if driver is None:
            continue
        fileno = _fileno(driver)
        if fileno is not None:
            try:
                os.close(fileno)
            except OSError:
                pass
        _inherited.append(driver)
        connection.connection = None
        logger.debug("dropped the database connection %r inherited from the worker's process",
                     connection.alias)


def _fileno(driver: Any) -> int | None:
    try:
        return int(driver.fileno())
    except Exception:
        pgconn = getattr(driver, "pgconn", None)  # psycopg 3
        socket = getattr(pgconn, "socket", None)
        return int(socket) if isinstance(socket, int) and socket >= 0 else None

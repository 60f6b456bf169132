"""Opening psycopg connections the way every part of this plugin uses them: autocommit (each
statement is its own transaction unless one is opened), UTC, TCP keepalives so a dead server is
noticed, and the process's role in ``application_name`` (visible in ``pg_stat_activity``).

**Poolers.** A server that refuses the ``options`` startup parameter is a pooler (PgBouncer does,
in every pool mode): the connection is made again without it, its time zone set by ``SET``
(which PgBouncer keeps for the client across server connections) and psycopg's prepared
statements off (a pooler in transaction mode hands each transaction another server connection,
where they do not exist). :func:`behind_pooler` tells the others (no ``LISTEN`` through it, no
session settings), and the process says so once per URL.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from worker_core.exceptions import TransportError
from worker_core.redaction import redact_url

__all__ = ["CONNECTION_ERRORS", "behind_pooler", "connect", "connection_errors"]

logger = logging.getLogger(__name__)

#: Seconds a connection attempt may take when nothing else says.
CONNECT_TIMEOUT = 10.0


def connection_errors() -> tuple[type[BaseException], ...]:
    """What a lost or refused connection raises (the worker reconnects on these)."""
    import psycopg

    return (psycopg.OperationalError, psycopg.InterfaceError)


CONNECTION_ERRORS: tuple[type[BaseException], ...] = ()

#: The URLs found to lead to a pooler in this process (see the module's docstring).
_pooled: set[str] = set()
_pooled_lock = threading.Lock()
#: What PgBouncer answers a startup packet with ``options`` in it.
_REFUSED_OPTIONS = "unsupported startup parameter: options"


def behind_pooler(conninfo: str) -> bool:
    """Whether a connection to ``conninfo`` was found to go through a pooler (PgBouncer)."""
    return conninfo in _pooled


def _found_pooler(conninfo: str) -> None:
    with _pooled_lock:
        if conninfo in _pooled:
            return
        _pooled.add(conninfo)
    logger.warning(
        "PostgreSQL at %s is behind a connection pooler (it refused the startup parameter 'options', "
        "as PgBouncer does): prepared statements off, no LISTEN through it (a direct listen_url "
        "wakes the worker at once; without one it polls every polling_interval) and "
        "consumer_synchronous_commit not applied",
        redact_url(conninfo),
    )


def connect(
    conninfo: str,
    *,
    role: str,
    prepare_threshold: int | None = 5,
    timeout: float | None = None,
    autocommit: bool = True,
) -> Any:
    """A new psycopg connection to ``conninfo``; ``role`` names it in ``application_name``.

    :raise psycopg.OperationalError: the server cannot be reached (a connection error).
    """
    import psycopg

    seconds = max(1, round(timeout or CONNECT_TIMEOUT))
    parameters: dict[str, Any] = dict(
        autocommit=autocommit,
        connect_timeout=seconds,
        application_name=f"worker {role} {socket.gethostname()}:{os.getpid()}"[:63],
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
    )
    if not behind_pooler(conninfo):
        try:
            return psycopg.connect(
                conninfo, prepare_threshold=prepare_threshold, options="-c TimeZone=UTC", **parameters
            )
        except psycopg.OperationalError as exc:
            if _REFUSED_OPTIONS not in str(exc):
                raise
        _found_pooler(conninfo)
    connection = psycopg.connect(conninfo, prepare_threshold=None, **parameters)
    try:
        # (PgBouncer tracks TimeZone: it sets it again on each server connection it lends)
        connection.execute("SET TimeZone TO 'UTC'")
        if not autocommit:
            connection.commit()
    except BaseException:
        connection.close()
        raise
    return connection


def refused(conninfo: str, exc: BaseException) -> TransportError:
    return TransportError(f"cannot use PostgreSQL at {redact_url(conninfo)}: {exc}")

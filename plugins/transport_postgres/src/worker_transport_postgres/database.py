"""Opening psycopg connections the way every part of this plugin uses them: autocommit (each
statement is its own transaction unless one is opened), UTC, TCP keepalives so a dead server is
noticed, and the process's role in ``application_name`` (visible in ``pg_stat_activity``)."""

from __future__ import annotations

import os
import socket
from typing import Any

from worker_core.exceptions import TransportError
from worker_core.redaction import redact_url

__all__ = ["CONNECTION_ERRORS", "connect", "connection_errors"]

#: Seconds a connection attempt may take when nothing else says.
CONNECT_TIMEOUT = 10.0


def connection_errors() -> tuple[type[BaseException], ...]:
    """What a lost or refused connection raises (the worker reconnects on these)."""
    import psycopg

    return (psycopg.OperationalError, psycopg.InterfaceError)


CONNECTION_ERRORS: tuple[type[BaseException], ...] = ()


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
    connection = psycopg.connect(
        conninfo,
        autocommit=autocommit,
        prepare_threshold=prepare_threshold,
        connect_timeout=seconds,
        application_name=f"worker {role} {socket.gethostname()}:{os.getpid()}"[:63],
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
        options="-c TimeZone=UTC",
    )
    return connection


def refused(conninfo: str, exc: BaseException) -> TransportError:
    return TransportError(f"cannot use PostgreSQL at {redact_url(conninfo)}: {exc}")

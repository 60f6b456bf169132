"""Enqueue in the application's transaction: the tasks a thread sends inside ``enqueue_in(conn)``
are written on ``conn``, the application's own database connection, in its open transaction, so
they exist only if it commits (and their consumers are notified at the commit, not before).

``conn`` is a psycopg 3 connection, Django's connection (``django.db.connection``, or one of
``django.db.connections``) on its psycopg 3 backend, or SQLAlchemy's ``Connection``, ``Session``
or ``Engine``-level pooled connection on the ``postgresql+psycopg`` dialect.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from worker_core.exceptions import ConfigurationError

__all__ = ["driver_connection", "enlisted", "enqueue_in"]

_local = threading.local()


def driver_connection(connection: Any) -> Any:
    """The psycopg 3 connection behind ``connection`` (see the module's docstring).

    :raise ConfigurationError: ``connection`` is none of those, or not on psycopg 3.
    """
    import psycopg

    seen = connection
    for _ in range(4):
        if isinstance(seen, psycopg.Connection):
            return seen
        if hasattr(seen, "ensure_connection") and hasattr(seen, "vendor"):  # Django's wrapper
            if seen.vendor != "postgresql":
                break
            seen.ensure_connection()
            seen = seen.connection
        elif hasattr(seen, "driver_connection"):  # SQLAlchemy's pooled connection
            seen = seen.driver_connection
        elif hasattr(seen, "get_bind") and callable(getattr(seen, "connection", None)):  # Session
            seen = seen.connection().connection
        elif hasattr(seen, "dialect") and hasattr(seen, "connection"):  # SQLAlchemy Connection
            seen = seen.connection
        else:
            break
    raise ConfigurationError(
        f"enqueue_in() takes the application's PostgreSQL connection on psycopg 3: a psycopg.Connection, "
        f"Django's django.db.connection (ENGINE django.db.backends.postgresql, with psycopg 3 installed) or "
        f"a SQLAlchemy Connection or Session on postgresql+psycopg:// (got {type(connection).__module__}."
        f"{type(connection).__qualname__}{_holding(connection, seen)})"
    )


def _holding(connection: Any, seen: Any) -> str:
    return "" if seen is connection else f", holding a {type(seen).__qualname__}"


@contextlib.contextmanager
def enqueue_in(connection: Any) -> Iterator[Any]:
    """Within the block, every task this thread sends to a PostgreSQL broker is written on
    ``connection``, in its transaction: a rollback leaves no task, a commit sends them all.

    ``connection`` must reach the broker's database (the queue tables are named with their
    schema, whatever the connection's ``search_path``). Blocks nest; the innermost wins. Tasks
    sent from other threads (``asend_task``'s, say) are not enlisted."""
    driver = driver_connection(connection)
    stack: list[Any] = _local.__dict__.setdefault("stack", [])
    stack.append(driver)
    try:
        yield driver
    finally:
        stack.pop()


def enlisted() -> Any | None:
    """The application's connection this thread sends on now, or None."""
    stack = _local.__dict__.get("stack")
    return stack[-1] if stack else None

"""PostgreSQL broker and result backend for worker: queues in tables of the application's own
database, consumers woken by LISTEN/NOTIFY, tasks enqueued in the application's transaction."""

from .backend import PostgresBackend
from .transaction import enqueue_in
from .transport import PostgresTransport

__all__ = ["PostgresBackend", "PostgresTransport", "enqueue_in"]

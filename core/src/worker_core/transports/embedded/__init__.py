"""The embedded transport: queues in a local SQLite file, shared by every process, no server needed.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

from .database import resolve_path
from .transport import OPTIONS, EmbeddedTransport

__all__ = ["OPTIONS", "EmbeddedTransport", "resolve_path"]

"""Celery's monitoring events (for Flower, ``celery events`` and any event receiver): worker
heartbeats by default, task events with ``-E``. See :mod:`.plugin`.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

from .dispatcher import EventDispatcher

__all__ = ["EventDispatcher"]

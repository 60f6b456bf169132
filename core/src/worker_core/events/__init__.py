"""Celery's monitoring events (for Flower, ``celery events`` and any event receiver): worker
heartbeats by default, task events with ``-E``. See :mod:`.plugin`."""

from .dispatcher import EventDispatcher

__all__ = ["EventDispatcher"]

"""Remote control over the broker (kombu's pidbox, compatible with Celery's): the commands a
worker answers, the consumer step that listens, and the client ``workerctl inspect`` uses.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

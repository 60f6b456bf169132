"""Event loops that come with worker-core: sync (blocking drain) and async (kombu hub).

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

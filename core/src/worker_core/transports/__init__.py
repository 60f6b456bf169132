"""Transports that come with worker-core: embedded (no server needed).

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

"""Pools that come with worker-core: solo (inline).

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

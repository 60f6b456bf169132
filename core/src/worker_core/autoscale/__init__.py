"""Autoscalers that come with worker-core.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

"""The worker: its runtime object and the worker blueprint's steps.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

"""The consumer: taking messages from the broker and handing them to the pool.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

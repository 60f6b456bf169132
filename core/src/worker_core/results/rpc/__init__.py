"""The ``rpc://`` result backend: states sent as messages to the client that sent the task, on
its reply queue, as Celery's RPC backend sends them (:mod:`.backend`); the worker's side
publishes them (:mod:`.publisher`), the client's side reads them (:mod:`.replies`).

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

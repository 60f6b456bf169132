"""Result backends: the stored format, and the embedded and disabled backends.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

"""Transports that come with worker-core: embedded (no server needed).

:mod:`.message` is public, for any transport built on kombu's virtual transports (see
:mod:`worker_core`); the embedded transport is internal, and uses only the public API.
"""

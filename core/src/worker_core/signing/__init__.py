"""Signed messages, interoperable with Celery's ``auth`` serializer: RSA signatures checked
against trusted certificates before a body is decoded (needs ``pip install './core[auth]'``).

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

from .envelope import AUTH, CONTENT_TYPE, Envelope, pack, unpack
from .setup import build, is_used, register, requires_signatures, setup, signs, verifies

__all__ = [
    "AUTH",
    "CONTENT_TYPE",
    "Envelope",
    "build",
    "is_used",
    "pack",
    "register",
    "requires_signatures",
    "setup",
    "signs",
    "unpack",
    "verifies",
]

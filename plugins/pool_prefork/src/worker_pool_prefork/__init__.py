"""The prefork pool for worker: tasks run in child processes forked on billiard."""

from .pool import PreforkPool

__all__ = ["PreforkPool"]

"""The thread pool for worker."""

from .pool import ThreadPool

__all__ = ["ThreadPool"]

"""The thread pool for worker."""

__all__: list[str] = []

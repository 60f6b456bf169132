"""The prefork pool for worker: tasks run in child processes forked on billiard."""

__all__: list[str] = []

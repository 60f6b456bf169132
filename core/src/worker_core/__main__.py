"""``python -m worker_core`` is ``workerctl``."""

from .cli import run

run()

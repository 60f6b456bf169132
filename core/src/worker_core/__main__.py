"""``python -m worker_core`` is ``workerctl``."""

from .cli import main

main(prog_name="workerctl")

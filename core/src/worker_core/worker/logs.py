"""Log output in the format Celery users know: ``[time: LEVEL/ProcessName] message``."""

from __future__ import annotations

import logging
import sys

__all__ = ["FORMAT", "setup_logging"]

FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"


def setup_logging(level: str, stream: object = None) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_worker_handler", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter(FORMAT))
    handler._worker_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.captureWarnings(True)

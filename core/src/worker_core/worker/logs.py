"""Log output in the format Celery users know: ``[time: LEVEL/ProcessName] message``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

from ..redaction import install_secret_filter

__all__ = ["FORMAT", "setup_logging"]

FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"


def setup_logging(level: str, stream: object = None, secrets: Iterable[str] = ()) -> None:
    """Log to ``stream`` (stderr) at ``level``; ``secrets`` never appear in a line (see
    :class:`~worker_core.redaction.SecretFilter`)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_worker_handler", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter(FORMAT))
    handler._worker_handler = True  # type: ignore[attr-defined]
    install_secret_filter([handler], secrets)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.captureWarnings(True)

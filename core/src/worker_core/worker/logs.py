"""Log output in the format Celery users know: ``[time: LEVEL/ProcessName] message``, to stderr
or to ``--logfile`` (reopened when logrotate moves it, as Celery's file handler does)."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from collections.abc import Iterable

from ..exceptions import ConfigurationError
from ..redaction import install_secret_filter

__all__ = ["FORMAT", "setup_logging"]

FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"


def setup_logging(level: str, stream: object = None, secrets: Iterable[str] = (),
                  logfile: str | None = None) -> None:
    """Log to ``logfile`` (a path, already expanded), else to ``stream`` (stderr), at ``level``;
    ``secrets`` never appear in a line (see :class:`~worker_core.redaction.SecretFilter`)."""
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_worker_handler", False):
            root.removeHandler(old)
            old.close()
    handler: logging.Handler
    if logfile:
        try:
            handler = logging.handlers.WatchedFileHandler(logfile, encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"--logfile {logfile}: cannot write it ({exc.strerror}); create its "
                                     "directory or give a path this user may write") from None
    else:
        handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter(FORMAT))
    setattr(handler, "_worker_handler", True)  # noqa: B010 - marks the handlers this module owns
    install_secret_filter([handler], secrets)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.captureWarnings(True)

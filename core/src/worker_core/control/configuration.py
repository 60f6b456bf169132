"""``inspect conf`` and the settings part of ``inspect report``: the configuration a worker runs
with, as Celery's worker lists it (the settings that differ from the defaults, or all of them),
secrets hidden. An app adapted from another framework that keeps a configuration of its own (a
:class:`~worker_core.slots.ListsConfiguration`) lists that one, with the worker's settings it
does not have."""

from __future__ import annotations

import pprint
import re
from typing import TYPE_CHECKING, Any

from ..app.settings import Settings
from ..redaction import redact_value
from ..slots import ListsConfiguration

if TYPE_CHECKING:
    from ..worker.worker import Worker

__all__ = ["as_data", "conf", "humanize", "own_settings"]


def own_settings(app: Any, with_defaults: bool) -> dict[str, Any]:
    """The app's settings (this project's) that differ from the defaults, every one
    ``with_defaults``, as data with secrets hidden."""
    settings, defaults = app.settings, Settings()
    return {name: redact_value(name, as_data(getattr(settings, name))) for name in Settings.names()
            if with_defaults or getattr(settings, name) != getattr(defaults, name)}


def conf(worker: Worker, with_defaults: Any = False, **_celery: Any) -> dict[str, Any]:
    """Celery's ``conf``: the configuration, every setting ``with_defaults`` (Celery's client
    sends ``with_defaults``; its command line says ``include_defaults``)."""
    app = worker.app
    every = _flag(with_defaults)
    if isinstance(app, ListsConfiguration):
        return dict(app.configuration(every))
    return own_settings(app, every)


def humanize(table: dict[str, Any]) -> str:
    """The table as Celery's ``report`` prints settings: ``name: value``, one a line."""
    return "\n".join(f"{name}: {pprint.pformat(value, width=50)}" for name, value in table.items())


def _flag(value: Any) -> bool:
    if isinstance(value, str):  # from a command line: Celery's strtobool
        return value.strip().lower() in ("1", "true", "yes", "y", "on")
    return bool(value)


def as_data(value: Any) -> Any:
    """A setting's value as a reply carries it: kombu queues and exchanges as their description,
    patterns as their text, router functions by name."""
    if hasattr(value, "as_dict"):
        return as_data(value.as_dict(recurse=True))
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, dict):
        return {as_data(key): as_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [as_data(item) for item in value]
    if callable(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
    return value

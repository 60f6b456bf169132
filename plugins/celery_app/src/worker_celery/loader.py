"""The ``celery`` app loader: ``-A`` naming a ``celery.Celery`` app, resolved as Celery's own
``-A`` resolves it (``proj``, ``proj.celery``, ``proj.celery:app``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from worker_core.exceptions import AppImportError, ConfigurationError

from .app import CeleryApp

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["CeleryLoader", "adapted"]

#: the Celery apps loaded in this process, by the spec that named them
_loaded: dict[str, CeleryApp] = {}


class CeleryLoader:
    """Adapts the Celery app a spec names (see :class:`worker_core.slots.AppLoader`)."""

    adapts: ClassVar[str] = "a celery.Celery app"

    @classmethod
    def load(cls, spec: str) -> CeleryApp | None:
        if spec in _loaded:
            return _loaded[spec]
        from celery import Celery
        from celery.app.utils import find_app

        try:
            found = find_app(spec)
        except (ImportError, AttributeError):
            return None
        if not isinstance(found, Celery):
            return None
        # What ``celery worker`` does before its first step: import the modules of ``imports`` and
        # ``include`` (and so autodiscovered tasks and Django's set-up), then list every task.
        try:
            found.loader.init_worker()
            found.finalize(auto=True)
        except Exception as exc:
            raise AppImportError.of(f"a task module of the Celery app {spec!r} (imports, include, "
                                    f"autodiscovery)", exc) from exc
        try:
            app = CeleryApp(found, spec)
        except ConfigurationError as exc:
            raise ConfigurationError(f"the Celery app {spec!r}'s configuration: {exc}") from None
        _loaded[spec] = app
        return app


def adapted(spec: str) -> Celery | None:
    """The Celery app (``celery.Celery``) loaded for ``spec`` in this process, if any."""
    app = _loaded.get(spec)
    return app.celery if app is not None else None

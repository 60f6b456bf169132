"""What workflows need of the app's result backend (its optional capabilities): a chord one that
joins (or polls) its header, a saved group one that keeps groups. Asked for before anything is
sent, with an error naming the backend and what to configure when it lacks them."""

from __future__ import annotations

from typing import Protocol

from ..exceptions import ConfigurationError
from ..redaction import redact_url
from ..slots import DiscardsResults, JoinsChords, RepliesToSender, ResultBackend, SavesGroups

__all__ = ["UsesResults", "require_chords", "require_groups"]


class UsesResults(Protocol):
    """An app, as far as its result backend goes."""

    @property
    def backend(self) -> ResultBackend:
        """This process's result backend."""

    def result_url(self) -> str:
        """The result backend's URL, for messages."""


_EXAMPLE = "App(..., backend='redis://localhost:6379/1') or the result_backend setting"


def _describe(app: UsesResults) -> str:
    backend = app.backend
    return f"{type(backend).__module__}.{type(backend).__qualname__} ({redact_url(app.result_url())})"


def require_chords(app: UsesResults) -> JoinsChords | None:
    """The app's result backend when it joins chords itself
    (:class:`~worker_core.slots.JoinsChords`); None when it does not, and a chord is joined by
    Celery's ``celery.chord_unlock`` task polling the header's results.

    :raise ConfigurationError: the backend keeps no results (``disabled``) or sends each to
        the task's sender (``rpc``), so nothing can join a chord; nothing has been sent.
    """
    backend = app.backend
    if isinstance(backend, JoinsChords):
        return backend
    if isinstance(backend, RepliesToSender):
        raise ConfigurationError(
            f"the result backend {_describe(app)} does not support chords, as Celery's rpc backend does "
            f"not: it sends each result to the client that sent the task, so no worker can join the "
            f"header's results (a group piped into a task is a chord too). Use the Redis result backend, "
            f"for example {_EXAMPLE} (worker-transport-redis)"
        )
    if isinstance(backend, DiscardsResults) and backend.discards_results:
        raise ConfigurationError(
            f"a chord needs a result backend that keeps the header's results, and the result backend "
            f"{_describe(app)} keeps none: configure one, for example {_EXAMPLE}"
        )
    return None


def require_groups(app: UsesResults) -> SavesGroups:
    """The app's result backend, which must save group results
    (:class:`~worker_core.slots.SavesGroups`).

    :raise ConfigurationError: it cannot.
    """
    backend = app.backend
    if isinstance(backend, SavesGroups):
        return backend
    keeps = " (it keeps no results: it sends them to the client that sent the task)" if isinstance(
        backend, RepliesToSender) else ""
    raise ConfigurationError(
        f"saving or restoring a group's result needs a result backend that keeps groups, and the "
        f"result backend {_describe(app)} does not{keeps}: use the embedded or the Redis result "
        f"backend, for example {_EXAMPLE}"
    )

"""What became of a task: one typed outcome, stored in one place, sent from a pool's process to
the worker's with its exception itself (or what stands in for one that cannot make the trip)."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest

from worker_core.app.settings import Settings
from worker_core.exceptions import Reject, Retry, TaskRevokedError, UnpicklableError
from worker_core.results import FAILURE, REJECTED, RETRY, REVOKED, SUCCESS, Outcome, store_outcome
from worker_core.results.embedded import EmbeddedBackend


class TakesTwo(Exception):
    """Pickles, but not back: its ``args`` do not hold what its constructor takes."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


class HoldsALock(Exception):
    """Does not pickle at all."""

    def __init__(self) -> None:
        super().__init__("with a lock", threading.Lock())


def _sent(outcome: Outcome) -> Outcome:
    """The outcome as a process pool gives it to the worker's main process."""
    arrived = pickle.loads(pickle.dumps(outcome, pickle.HIGHEST_PROTOCOL))
    assert isinstance(arrived, Outcome)
    return arrived


def test_a_success_crosses_from_a_pool_process_in_a_few_bytes_without_its_request() -> None:
    outcome = Outcome(SUCCESS, 0.25, "'done'", request={"id": "t", "args": [1] * 1000})
    assert len(pickle.dumps(outcome, pickle.HIGHEST_PROTOCOL)) < 120
    arrived = _sent(outcome)
    assert (arrived.state, arrived.runtime, arrived.value, arrived.request) == (SUCCESS, 0.25, "'done'", None)


def test_a_failure_crosses_with_its_exception_itself() -> None:
    exc = KeyError("missing")
    arrived = _sent(Outcome(FAILURE, 1.5, exception=exc, traceback="Traceback ...", task_id="t"))
    assert type(arrived.exception) is KeyError and arrived.exception.args == ("missing",)
    assert (arrived.exc_type, arrived.traceback, arrived.task_id) == ("KeyError", "Traceback ...", "t")


@pytest.mark.parametrize("exc", [TakesTwo(404, "not here"), HoldsALock()],
                         ids=["does-not-unpickle", "does-not-pickle"])
def test_an_exception_that_cannot_make_the_trip_arrives_as_a_stand_in_with_its_name_message_and_repr(
        exc: Exception) -> None:
    arrived = _sent(Outcome(FAILURE, exception=exc, traceback="tb"))
    stand_in = arrived.exception
    assert isinstance(stand_in, UnpicklableError)
    assert arrived.exc_type == type(exc).__name__
    assert (stand_in.exc_module, stand_in.exc_type) == (__name__, type(exc).__qualname__)
    assert str(stand_in) == str(exc) and repr(stand_in) == repr(exc)
    # and it travels on as itself
    assert type(_sent(Outcome(FAILURE, exception=stand_in)).exception) is UnpicklableError


def _backend(tmp_path: Path) -> EmbeddedBackend:
    return EmbeddedBackend(f"embedded://{tmp_path}/results.db", Settings())


def test_store_outcome_stores_a_value_or_the_exception_as_celery_encodes_it(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    store_outcome(backend, Outcome(SUCCESS, value={"sum": 3}, task_id="ok", request={"task": "add"}))
    store_outcome(backend, Outcome(FAILURE, exception=KeyError("missing"), traceback="Traceback ...",
                                   task_id="bad"))
    store_outcome(backend, Outcome(REVOKED, exception=TaskRevokedError("revoked"), task_id="gone"))
    assert backend.get_task_meta("ok")["result"] == {"sum": 3}
    failed = backend.get_task_meta("bad")
    assert (failed["status"], failed["traceback"]) == (FAILURE, "Traceback ...")
    assert failed["result"] == {"exc_type": "KeyError", "exc_message": ["missing"], "exc_module": "builtins"}
    assert backend.get_task_meta("gone")["result"]["exc_module"] == "celery.exceptions"


def test_a_retry_is_stored_as_its_reason_as_celery_stores_it(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    retry = Retry(exc=ValueError("flaky"), when=5)
    store_outcome(backend, Outcome(RETRY, exception=retry, task_id="again"))
    store_outcome(backend, Outcome(RETRY, exception=Retry("cancelled"), task_id="cancelled"))
    assert backend.get_task_meta("again")["result"]["exc_type"] == "ValueError"
    assert backend.get_task_meta("cancelled")["result"]["exc_type"] == "Retry"


def test_store_outcome_passes_a_tasks_own_serializer_and_only_then(tmp_path: Path) -> None:
    calls: list[dict[str, object]] = []

    class Recording(EmbeddedBackend):
        def store_result(self, task_id, result, state, traceback=None, request=None, **options):  # type: ignore[no-untyped-def,override]
            calls.append(options)
            super().store_result(task_id, result, state, traceback, request, **options)

    backend = Recording(f"embedded://{tmp_path}/results.db", Settings())
    store_outcome(backend, Outcome(SUCCESS, value=1, task_id="a"))
    store_outcome(backend, Outcome(SUCCESS, value=1, task_id="b"), "json")
    assert calls == [{}, {"serializer": "json"}]


def test_an_outcome_without_a_task_id_is_refused_saying_so(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs its task id"):
        store_outcome(_backend(tmp_path), Outcome(REJECTED, exception=Reject("no")))

"""The result backend contract suite: checks any :class:`~worker_core.slots.ResultBackend`
against a real store of its kind, as the worker writes and as clients read.

A third-party backend runs it in one line, given a URL it may write to (each check uses task
ids of its own, ``contract-<uuid>``, and forgets them)::

    from worker_core.testing import result_backend_contract

    result_backend_contract.run_all(MyBackend, "mydb://127.0.0.1/7")

or, to see each check as its own pytest test::

    @pytest.mark.parametrize("check", result_backend_contract.CHECKS,
                             ids=result_backend_contract.check_name)
    def test_my_backend_honours_the_result_backend_contract(check):
        check(MyBackend, "mydb://127.0.0.1/7")

Each check raises ``AssertionError`` naming the backend and what it did wrong. A backend that
:class:`~worker_core.slots.DiscardsResults` is checked for that promise instead of the round trips;
one that promises :class:`~worker_core.slots.SuccessIsFinal` is checked for it; one that
:class:`~worker_core.slots.SavesGroups` or :class:`~worker_core.slots.JoinsChords` is checked for
what those capabilities declare. One that :class:`~worker_core.slots.RepliesToSender` (``rpc://``,
given the broker in ``settings``) is checked as its clients use it: each state is stored with the
``reply_to`` of the client that reads it (which declared its queue first, as before sending a
task), a read waits for the state to arrive, and what only the sending client can read is
checked too.

One module, as every shipped suite: a third party imports one name and runs it.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

import attrs

from ..app.context import MESSAGE_FIELDS
from ..app.settings import SERIALIZER_LIBRARIES, Settings
from ..exceptions import BackendDisabled, ResultError, ResultTimeout
from ..plugins.conformance import conformance_problem
from ..results.meta import FAILURE, PENDING, READY_STATES, RETRY, REVOKED, STARTED, SUCCESS, encode_exception
from ..slots import (
    BackendCountsDeliveries,
    DiscardsResults,
    JoinsChords,
    RepliesToSender,
    ResultBackend,
    SavesGroups,
    SuccessIsFinal,
)

__all__ = ["CHECKS", "Check", "applies", "check_name", "full_request", "run_all"]

#: Seconds a check lets ``wait_for`` wait for a result that is on its way.
WAIT_TIMEOUT = 10.0
#: How long after ``wait_for`` starts another thread or process stores the result.
STORE_DELAY = 0.3


class Check(Protocol):
    __name__: str

    def __call__(
        self, backend: type[ResultBackend], url: str, *, settings: Settings | None = None
    ) -> None: ...


def _expect(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _label(backend: type[ResultBackend]) -> str:
    return f"{backend.__module__}.{backend.__qualname__}"


def _new_id() -> str:
    return f"contract-{uuid.uuid4()}"


def _discards(backend: object) -> bool:
    return isinstance(backend, DiscardsResults) and backend.discards_results


def _replies(backend: object) -> bool:
    return isinstance(backend, RepliesToSender)


def full_request(task_id: str, name: str = "contract.add") -> dict[str, Any]:
    """The request mapping the worker passes to ``store_result`` for a task that ran: every
    message field (:data:`~worker_core.app.context.MESSAGE_FIELDS`) with the task's name, id,
    args and kwargs."""
    fields: dict[str, Any] = dict.fromkeys(MESSAGE_FIELDS)
    fields.update(
        retries=2, timelimit=[None, None], root_id=task_id, parent_id="contract-parent",
        group="contract-group", group_index=0, origin="gen1@contract", hostname="worker1@contract",
        reply_to="replies", correlation_id=task_id, ignore_result=False,
        delivery_info={"exchange": "", "routing_key": "contract-queue", "priority": 0, "redelivered": False},
    )
    fields.update(task=name, id=task_id, args=[2, 3], kwargs={"z": 1})
    return fields


class _Store:
    """The backend instances and task ids of one check; every id is forgotten at the end."""

    def __init__(self, backend: type[ResultBackend], url: str, settings: Settings | None) -> None:
        self.backend_class = backend
        self.label = _label(backend)
        self.url = url
        self.settings = settings or Settings()
        self.instances: list[ResultBackend] = []
        self.ids: list[str] = []
        self.group_ids: list[str] = []
        self.backend = self.build()

    def build(self, **changes: Any) -> ResultBackend:
        instance = self.backend_class(self.url, attrs.evolve(self.settings, **changes))
        self.instances.append(instance)
        return instance

    def new_id(self) -> str:
        task_id = _new_id()
        self.ids.append(task_id)
        return task_id

    def new_group_id(self) -> str:
        group_id = _new_id()
        self.group_ids.append(group_id)
        return group_id

    def meta(self, task_id: str, backend: ResultBackend | None = None, *,
             until: str | None = None) -> Mapping[str, Any]:
        """What ``backend`` (the store's own by default) reads for ``task_id``; for a backend
        replying to the sender, read again until the state ``until`` has arrived (or
        ``WAIT_TIMEOUT`` passed)."""
        reader = backend or self.backend
        meta = reader.get_task_meta(task_id)
        if until is not None and _replies(reader):
            deadline = time.monotonic() + WAIT_TIMEOUT
            while meta.get("status") != until and time.monotonic() < deadline:
                time.sleep(0.01)
                meta = reader.get_task_meta(task_id)
        _expect(isinstance(meta, Mapping), f"{self.label}.get_task_meta() returned {meta!r}, not a mapping")
        return meta

    def asked(self, task_id: str, request: Mapping[str, Any] | None,
              reader: ResultBackend | None = None) -> Mapping[str, Any] | None:
        """The request a worker passes when the client ``reader`` (the store's own backend by
        default) sent the task: for a backend replying to the sender, ``reader`` declares its
        reply queue as before sending a task, and the request names it in ``reply_to``; others
        get ``request`` as it is."""
        reader = reader or self.backend
        if not _replies(reader):
            return request
        assert isinstance(reader, RepliesToSender)
        reader.on_task_call(task_id)
        return {**(request or {}), "reply_to": reader.reply_to(), "correlation_id": task_id}

    def settle(self, writer: ResultBackend | None = None, reader: ResultBackend | None = None) -> None:
        """For a backend replying to the sender: wait until what ``writer`` sent ``reader`` so
        far has arrived (a marker sent after it is read: one sender's states arrive in order);
        nothing to wait for with others."""
        reader = reader or self.backend
        if not _replies(reader):
            return
        marker = self.new_id()
        request = self.asked(marker, None, reader)
        (writer or self.backend).store_result(marker, "marker", SUCCESS, None, request)
        reader.wait_for(marker, timeout=WAIT_TIMEOUT, interval=0.05)

    def close(self) -> None:
        if not _discards(self.backend):
            for task_id in self.ids:
                with contextlib.suppress(Exception):
                    self.backend.forget(task_id)
        if isinstance(self.backend, SavesGroups):
            for group_id in self.group_ids:
                with contextlib.suppress(Exception):
                    self.backend.delete_group(group_id)
        for instance in self.instances:
            with contextlib.suppress(Exception):
                instance.close()


@contextlib.contextmanager
def _store(backend: type[ResultBackend], url: str, settings: Settings | None) -> Iterator[_Store]:
    store = _Store(backend, url, settings)
    try:
        yield store
    finally:
        store.close()


#: The checks of what a stored result reads back as (see :func:`applies`).
_ROUND_TRIPS: set[str] = set()


def _round_trips(check: Check) -> Check:
    """Marks a check of what a stored result reads back as: a backend that discards results is
    checked by :func:`check_a_backend_that_discards_results_keeps_its_promise` instead."""
    _ROUND_TRIPS.add(check.__name__)
    return check


#: The checks of an optional capability, by name: they say nothing about a backend without it.
_OFFERED: dict[str, type] = {}


def _when_offered(capability: type) -> Callable[[Check], Check]:
    """Marks a check of ``capability``: it applies to backends that offer it (see
    :func:`applies`) and passes for the others."""
    def mark(check: Check) -> Check:
        _OFFERED[check.__name__] = capability
        return check

    return mark


def _store_later(backend: ResultBackend, task_id: str, value: Any,
                 request: Mapping[str, Any] | None = None) -> threading.Thread:
    thread = threading.Timer(STORE_DELAY, backend.store_result, (task_id, value, SUCCESS, None, request))
    thread.start()
    return thread


def _wait(store: _Store, task_id: str) -> tuple[Mapping[str, Any], float]:
    began = time.monotonic()
    meta = store.backend.wait_for(task_id, timeout=WAIT_TIMEOUT, interval=0.05)
    return meta, time.monotonic() - began


def _store_in_a_new_process(backend: type[ResultBackend], url: str, settings: Settings, task_id: str,
                            request: Mapping[str, Any] | None) -> None:
    """Run in a spawned process: build the backend afresh and store after a pause."""
    time.sleep(STORE_DELAY)
    instance = backend(url, settings)
    instance.store_result(task_id, {"from": "another process"}, SUCCESS, None, request)
    instance.close()


# -- the checks -----------------------------------------------------------------------------------


def check_the_class_satisfies_the_result_backend_protocol(
    backend: type[ResultBackend], url: str, *, settings: Settings | None = None
) -> None:
    """Every member of :class:`~worker_core.slots.ResultBackend` is there (what the plugin manager
    checks when it loads a backend), its optional capabilities are whole, and an instance is a
    ``ResultBackend``."""
    label = _label(backend)
    problem = conformance_problem("result_backend", backend)
    _expect(problem is None, f"{label} {problem}")
    declared: object = backend
    if isinstance(declared, SuccessIsFinal):
        _expect(isinstance(declared.success_is_final, bool),
                f"{label}.success_is_final must be a bool (got {declared.success_is_final!r})")
    if isinstance(declared, DiscardsResults):
        _expect(isinstance(declared.discards_results, bool),
                f"{label}.discards_results must be a bool (got {declared.discards_results!r})")
    with _store(backend, url, settings) as store:
        _expect(isinstance(store.backend, ResultBackend), f"{label}(url, settings) is not a ResultBackend")


@_round_trips
def check_an_unknown_task_is_pending(backend: type[ResultBackend], url: str, *,
                                     settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        meta = store.meta(task_id)
        _expect(meta.get("status") == PENDING and meta.get("result") is None
                and meta.get("task_id") == task_id,
                f"{store.label}.get_task_meta() of an unknown task returned {dict(meta)!r}; expected status "
                f"PENDING, result None and task_id {task_id!r}")


@_round_trips
def check_a_success_is_stored_in_celerys_format(backend: type[ResultBackend], url: str, *,
                                               settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        when = datetime(2024, 5, 17, 12, 30, tzinfo=timezone.utc)
        value = {"sum": 5, "items": [1, "two", None], "when": when, "id": uuid.UUID(int=7)}
        store.backend.store_result(task_id, value, SUCCESS, None, store.asked(task_id, full_request(task_id)))
        meta = store.meta(task_id, until=SUCCESS)
        for key in ("status", "result", "traceback", "children", "date_done", "task_id"):
            _expect(key in meta, f"{store.label} stored {dict(meta)!r} without Celery's key {key!r}")
        _expect(meta["status"] == SUCCESS and meta["task_id"] == task_id and meta["traceback"] is None
                and meta["children"] == [], f"{store.label} stored {dict(meta)!r} for a SUCCESS")
        _expect(meta["result"] == value, f"{store.label} stored {value!r} and read back {meta['result']!r} "
                                         f"(kombu's JSON round-trips datetimes and UUIDs)")
        _expect(isinstance(meta["date_done"], str) and datetime.fromisoformat(meta["date_done"]),
                f"{store.label}: date_done {meta['date_done']!r} is not an ISO 8601 time")
        _expect(meta.get("parent_id") == "contract-parent" and meta.get("group_id") == "contract-group",
                f"{store.label} did not keep parent_id and group_id from the request: {dict(meta)!r}")


@_round_trips
def check_exception_states_store_celerys_exception_encoding(backend: type[ResultBackend], url: str, *,
                                                            settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        error = encode_exception(ValueError("boom", 3))
        for state in (FAILURE, RETRY, REVOKED):
            task_id = store.new_id()
            store.backend.store_result(task_id, error, state, "Traceback (most recent call last): ...",
                                       store.asked(task_id, full_request(task_id)))
            meta = store.meta(task_id, until=state)
            _expect(meta.get("status") == state and meta.get("result") == error,
                    f"{store.label} stored {state} with {error!r} and read back {dict(meta)!r}")
            _expect(meta.get("traceback") == "Traceback (most recent call last): ...",
                    f"{store.label} lost the traceback of a {state}: {meta.get('traceback')!r}")
            done = meta.get("date_done")
            _expect((done is not None) == (state in READY_STATES),
                    f"{store.label}: date_done is {done!r} for {state}; Celery sets it for ready states only")


@_round_trips
def check_a_later_state_replaces_an_earlier_one(backend: type[ResultBackend], url: str, *,
                                                settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        for state, value in ((STARTED, {"pid": 1}), (RETRY, encode_exception(RuntimeError("again"))),
                             (FAILURE, encode_exception(RuntimeError("no")))):
            request = store.asked(task_id, full_request(task_id))
            store.backend.store_result(task_id, value, state, None, request)
            meta = store.meta(task_id, until=state)
            _expect(meta.get("status") == state and meta.get("result") == value,
                    f"{store.label}: after storing {state} the task reads {dict(meta)!r}")


@_round_trips
def check_a_success_is_never_overwritten_when_promised(backend: type[ResultBackend], url: str, *,
                                                       settings: Settings | None = None) -> None:
    """With :class:`~worker_core.slots.SuccessIsFinal`, a FAILURE or RETRY stored after a SUCCESS
    (a duplicate run) leaves the SUCCESS as it was."""
    declared: object = backend
    if not (isinstance(declared, SuccessIsFinal) and declared.success_is_final):
        return
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        store.backend.store_result(task_id, 42, SUCCESS, None, store.asked(task_id, full_request(task_id)))
        store.meta(task_id, until=SUCCESS)
        for state in (FAILURE, RETRY, STARTED):
            store.backend.store_result(task_id, encode_exception(RuntimeError("late")), state, None,
                                       store.asked(task_id, None))
            store.settle()
            meta = store.meta(task_id)
            _expect(meta.get("status") == SUCCESS and meta.get("result") == 42,
                    f"{store.label} promises success_is_final, yet a {state} stored after the SUCCESS left "
                    f"{dict(meta)!r}")


@_round_trips
def check_wait_for_returns_when_another_thread_stores(backend: type[ResultBackend], url: str, *,
                                                      settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        writer = _store_later(store.build(), task_id, "from a thread", store.asked(task_id, None))
        try:
            meta, took = _wait(store, task_id)
        finally:
            writer.join()
        _expect(meta.get("status") == SUCCESS and meta.get("result") == "from a thread",
                f"{store.label}.wait_for() returned {dict(meta)!r} for a result another thread stored")
        _expect(took >= STORE_DELAY * 0.9, f"{store.label}.wait_for() returned after {took:.2f}s, before the "
                                           f"result was stored ({STORE_DELAY}s)")


@_round_trips
def check_wait_for_returns_when_another_process_stores(backend: type[ResultBackend], url: str, *,
                                                       settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        writer = multiprocessing.get_context("spawn").Process(
            target=_store_in_a_new_process,
            args=(backend, url, store.settings, task_id, store.asked(task_id, None)), daemon=True)
        writer.start()
        try:
            meta = store.backend.wait_for(task_id, timeout=WAIT_TIMEOUT + 20, interval=0.05)
        finally:
            writer.join(30)
        _expect(writer.exitcode == 0, f"{store.label}: the process storing the result exited with "
                                      f"{writer.exitcode}")
        _expect(meta.get("status") == SUCCESS and meta.get("result") == {"from": "another process"},
                f"{store.label}.wait_for() returned {dict(meta)!r} for a result another process stored")


@_round_trips
def check_wait_for_raises_result_timeout_after_its_timeout(backend: type[ResultBackend], url: str, *,
                                                           settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        store.backend.store_result(task_id, None, STARTED, None, store.asked(task_id, full_request(task_id)))
        store.meta(task_id, until=STARTED)
        began = time.monotonic()
        try:
            meta = store.backend.wait_for(task_id, timeout=0.3, interval=0.05)
        except ResultTimeout as exc:
            took = time.monotonic() - began
            _expect(0.3 <= took < 5.0, f"{store.label}.wait_for(timeout=0.3) raised after {took:.2f}s")
            _expect(task_id in str(exc), f"{store.label}: ResultTimeout should name the task: {exc}")
        except Exception as exc:
            raise AssertionError(f"{store.label}.wait_for() raised {exc!r} after its timeout; it must raise "
                                 f"worker_core.exceptions.ResultTimeout") from exc
        else:
            raise AssertionError(f"{store.label}.wait_for() of a task still STARTED returned {dict(meta)!r} "
                                 f"instead of raising ResultTimeout")


@_round_trips
def check_on_task_call_then_wait_for(backend: type[ResultBackend], url: str, *,
                                     settings: Settings | None = None) -> None:
    """As a client does: ``on_task_call`` just before sending, then ``wait_for``, whether the
    result is stored before the wait begins or while it waits."""
    with _store(backend, url, settings) as store:
        worker = store.build()
        early = store.new_id()
        store.backend.on_task_call(early)
        worker.store_result(early, "early", SUCCESS, None, store.asked(early, full_request(early)))
        meta, _ = _wait(store, early)
        _expect(meta.get("result") == "early", f"{store.label}: stored before wait_for, read {dict(meta)!r}")
        late = store.new_id()
        store.backend.on_task_call(late)
        writer = _store_later(worker, late, "late", store.asked(late, full_request(late)))
        try:
            meta, _ = _wait(store, late)
        finally:
            writer.join()
        _expect(meta.get("result") == "late",
                f"{store.label}: stored while wait_for ran, read {dict(meta)!r}")


@_round_trips
def check_forget_deletes_a_result(backend: type[ResultBackend], url: str, *,
                                  settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        store.backend.store_result(task_id, 1, SUCCESS, None, store.asked(task_id, full_request(task_id)))
        store.meta(task_id, until=SUCCESS)
        store.backend.forget(task_id)
        meta = store.meta(task_id)
        _expect(meta.get("status") == PENDING, f"{store.label}: after forget() the task reads {dict(meta)!r}")
        store.backend.forget(store.new_id())  # an unknown id is no error
        # forgotten before its state arrives (or is stored): nothing of it is read afterwards
        early = store.new_id()
        request = store.asked(early, full_request(early))
        store.backend.forget(early)
        store.backend.store_result(early, 1, SUCCESS, None, request)
        store.backend.forget(early)
        store.settle()
        meta = store.meta(early)
        _expect(meta.get("status") == PENDING,
                f"{store.label}: after forget() of a task stored just then, it reads {dict(meta)!r}")


@_round_trips
def check_a_closed_backend_can_be_used_again(backend: type[ResultBackend], url: str, *,
                                             settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        task_id = store.new_id()
        store.backend.store_result(task_id, "before", SUCCESS, None, store.asked(task_id, None))
        store.backend.close()
        store.backend.close()  # a second close is harmless
        _expect(store.meta(task_id, until=SUCCESS).get("result") == "before",
                f"{store.label}: reading after close() failed")
        again = store.new_id()
        store.backend.store_result(again, "after", SUCCESS, None, store.asked(again, None))
        _expect(store.meta(again, until=SUCCESS).get("result") == "after",
                f"{store.label}: storing after close() failed")


@_round_trips
def check_an_instance_works_in_a_forked_child_and_still_in_its_parent(
    backend: type[ResultBackend], url: str, *, settings: Settings | None = None
) -> None:
    """A prefork child inherits the instances of its parent: the child opens its own connections
    (leaving the parent's alone) and the parent's instance keeps working. (With a backend replying
    to the sender the child is another client: it reads nothing the parent was sent.)"""
    if not hasattr(os, "fork"):
        return
    with _store(backend, url, settings) as store:
        before, child_id, after = store.new_id(), store.new_id(), store.new_id()
        store.backend.store_result(before, "parent", SUCCESS, None, store.asked(before, None))
        store.meta(before, until=SUCCESS)  # connected before the fork
        child_request = store.asked(child_id, full_request(child_id))
        expected = None if _replies(store.backend) else "parent"
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what went wrong through the pipe, and never return
            status, report = 0, b""
            try:
                store.backend.store_result(child_id, "child", SUCCESS, None, child_request)
                seen = store.backend.get_task_meta(before).get("result")
                if seen != expected:
                    status, report = 1, f"the child read {seen!r} for the parent's result".encode()
                store.backend.close()
            except BaseException as exc:
                status, report = 1, repr(exc).encode()
            os.write(write, report)
            os._exit(status)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read, "rb") as pipe:
            failure = pipe.read().decode(errors="replace")
        _expect(os.waitstatus_to_exitcode(status) == 0,
                f"{store.label}: an instance used in a forked child failed there: {failure}")
        _expect(store.meta(child_id, until=SUCCESS).get("result") == "child",
                f"{store.label}: the result stored in the child reads {dict(store.meta(child_id))!r}")
        store.backend.store_result(after, "parent again", SUCCESS, None, store.asked(after, None))
        _expect(store.meta(after, until=SUCCESS).get("result") == "parent again",
                f"{store.label}: the parent's instance stopped working after its child closed its copy")


@_round_trips
def check_result_extended_stores_the_request_fields(backend: type[ResultBackend], url: str, *,
                                                    settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        extended = store.build(result_extended=True)
        task_id = store.new_id()
        request = full_request(task_id, name="contract.extended")
        extended.store_result(task_id, 5, SUCCESS, None, store.asked(task_id, request, extended))
        meta = store.meta(task_id, extended, until=SUCCESS)
        expected = {"name": "contract.extended", "args": [2, 3], "kwargs": {"z": 1},
                    "worker": "worker1@contract", "retries": 2, "queue": "contract-queue"}
        wrong = {key: meta.get(key) for key, value in expected.items() if meta.get(key) != value}
        _expect(not wrong, f"{store.label} with result_extended stored {wrong!r}; expected {expected!r}")


@_round_trips
def check_store_result_takes_every_request_the_worker_passes(backend: type[ResultBackend], url: str, *,
                                                             settings: Settings | None = None) -> None:
    """``None`` (a revoke), ``{"task": name}`` (a refused message), the same with the message's
    ``reply_to`` and ``correlation_id``, and a full request. A backend replying to the sender
    sends nothing for the first two (they name no client) and reads nothing of them."""
    with _store(backend, url, settings) as store:
        nowhere = _replies(store.backend)
        shapes: list[Mapping[str, Any] | None] = [None, {"task": "contract.refused"}]
        for request in shapes:
            task_id = store.new_id()
            store.backend.store_result(task_id, encode_exception(RuntimeError("x")), REVOKED, None, request)
            store.settle()
            expected = PENDING if nowhere else REVOKED
            _expect(store.meta(task_id).get("status") == expected,
                    f"{store.label}: after store_result(..., request={request!r}) the task reads "
                    f"{dict(store.meta(task_id))!r}, not {expected}")
        task_id = store.new_id()
        refused = store.asked(task_id, {"task": "contract.refused", "reply_to": "replies",
                                        "correlation_id": task_id})
        store.backend.store_result(task_id, encode_exception(RuntimeError("x")), REVOKED, None, refused)
        _expect(store.meta(task_id, until=REVOKED).get("status") == REVOKED,
                f"{store.label}: store_result(..., request={refused!r}) did not store REVOKED")
        task_id = store.new_id()
        store.backend.store_result(task_id, 1, SUCCESS, None, store.asked(task_id, full_request(task_id)))
        _expect(store.meta(task_id, until=SUCCESS).get("status") == SUCCESS,
                f"{store.label}: a full request was not stored")


@_round_trips
def check_store_result_is_safe_from_several_threads(backend: type[ResultBackend], url: str, *,
                                                    settings: Settings | None = None) -> None:
    with _store(backend, url, settings) as store:
        ids = [[store.new_id() for _ in range(20)] for _ in range(6)]
        requests = {task_id: store.asked(task_id, full_request(task_id))
                    for batch in ids for task_id in batch}
        errors: list[BaseException] = []
        start = threading.Barrier(len(ids))

        def write(batch: list[str]) -> None:
            try:
                start.wait()
                for task_id in batch:
                    store.backend.store_result(task_id, task_id, SUCCESS, None, requests[task_id])
                    store.backend.get_task_meta(batch[0])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(batch,)) for batch in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        _expect(not errors,
                f"{store.label}: store_result from {len(ids)} threads at once raised {errors[:3]!r}")
        wrong = [task_id for batch in ids for task_id in batch
                 if store.meta(task_id, until=SUCCESS).get("result") != task_id]
        _expect(not wrong, f"{store.label}: after stores from several threads, {len(wrong)} results read "
                           f"wrong, for example {wrong[:3]!r}")


@_when_offered(SavesGroups)
def check_saved_groups_restore_as_saved_when_offered(backend: type[ResultBackend], url: str, *,
                                                     settings: Settings | None = None) -> None:
    """With :class:`~worker_core.slots.SavesGroups`: a group's result tuple (tasks with and
    without parents, a nested group) restores as it was saved, from another instance too; a
    second save replaces the first; an unknown or deleted group restores as None, and deleting an
    unknown one is no error."""
    declared: object = backend
    if not isinstance(declared, SavesGroups):
        return
    with _store(backend, url, settings) as store:
        groups = store.backend
        assert isinstance(groups, SavesGroups)
        group_id, inner, first, second, third = (store.new_group_id(), _new_id(), _new_id(), _new_id(),
                                                 _new_id())
        saved = [[group_id, None], [
            [[first, None], None],
            [[second, [[first, None], None]], None],
            [[inner, None], [[[third, None], None]]],
        ]]
        groups.save_group(group_id, saved)
        restored = groups.restore_group(group_id)
        _expect(restored == saved, f"{store.label}.restore_group() gave {restored!r} for the saved {saved!r}")
        other = store.build()
        assert isinstance(other, SavesGroups)
        _expect(other.restore_group(group_id) == saved,
                f"{store.label}: another instance restored {other.restore_group(group_id)!r} for {saved!r}")
        again = [[group_id, [[first, None], None]], [[[second, None], None]]]
        groups.save_group(group_id, again)
        _expect(groups.restore_group(group_id) == again,
                f"{store.label}: a second save_group() left {groups.restore_group(group_id)!r}, not "
                f"{again!r}")
        groups.delete_group(group_id)
        _expect(groups.restore_group(group_id) is None,
                f"{store.label}: after delete_group() the group restores as "
                f"{groups.restore_group(group_id)!r}")
        unknown = _new_id()
        _expect(groups.restore_group(unknown) is None,
                f"{store.label}.restore_group() of an unknown group gave {groups.restore_group(unknown)!r}")
        groups.delete_group(unknown)


@_when_offered(JoinsChords)
def check_a_chord_join_can_be_prepared_when_offered(backend: type[ResultBackend], url: str, *,
                                                    settings: Settings | None = None) -> None:
    """With :class:`~worker_core.slots.JoinsChords`: what a client calls before it sends a
    chord's header (``apply_chord`` with a header of tasks and one holding a group, then
    ``set_chord_size``, and both again for a chord sent a second time) is accepted."""
    declared: object = backend
    if not isinstance(declared, JoinsChords):
        return
    with _store(backend, url, settings) as store:
        chords = store.backend
        assert isinstance(chords, JoinsChords)
        plain, nested = store.new_group_id(), store.new_group_id()
        headers = {
            plain: [[plain, None], [[[_new_id(), None], None], [[_new_id(), None], None]]],
            nested: [[nested, None], [[[_new_id(), None], None],
                                      [[_new_id(), None], [[[_new_id(), None], None]]]]],
        }
        for _ in range(2):
            for group_id, header in headers.items():
                try:
                    chords.apply_chord(group_id, header)
                    chords.set_chord_size(group_id, 2)
                except Exception as exc:
                    raise AssertionError(f"{store.label} joins chords, yet preparing the chord of group "
                                         f"{group_id} with header {header!r} raised {exc!r}") from exc


@_when_offered(RepliesToSender)
def check_only_the_client_that_sent_a_task_reads_it_when_offered(
    backend: type[ResultBackend], url: str, *, settings: Settings | None = None
) -> None:
    """With :class:`~worker_core.slots.RepliesToSender`: each thread is a client with a reply
    queue of its own (``reply_to`` names it, the same on every call, another in another thread);
    the states sent to a client are read by it whatever order its tasks finish in, and by no
    other client (another thread reads PENDING, and its wait ends in ``ResultTimeout`` naming the
    task)."""
    declared: object = backend
    if not isinstance(declared, RepliesToSender):
        return
    with _store(backend, url, settings) as store:
        client = store.backend
        assert isinstance(client, RepliesToSender)
        name = client.reply_to()
        _expect(isinstance(name, str) and name and client.reply_to() == name,
                f"{store.label}.reply_to() gave {name!r}, then {client.reply_to()!r}: one non-empty name per "
                f"thread")
        worker = store.build()
        ids = [store.new_id() for _ in range(5)]
        requests = {task_id: store.asked(task_id, full_request(task_id)) for task_id in ids}
        for task_id in reversed(ids):
            worker.store_result(task_id, task_id, SUCCESS, None, requests[task_id])
        for task_id in ids:
            meta = client.wait_for(task_id, timeout=WAIT_TIMEOUT, interval=0.05)
            _expect(meta.get("result") == task_id,
                    f"{store.label}: five results stored last to first, waited for first to last: "
                    f"task {task_id} read {dict(meta)!r}")
        mine = store.new_id()
        worker.store_result(mine, "mine", SUCCESS, None, store.asked(mine, full_request(mine)))
        store.meta(mine, until=SUCCESS)
        seen: dict[str, Any] = {}

        def read_in_another_thread() -> None:
            try:
                seen["reply_to"] = client.reply_to()
                seen["meta"] = dict(client.get_task_meta(mine))
                try:
                    client.wait_for(mine, timeout=0.3, interval=0.05)
                except ResultTimeout as exc:
                    seen["timeout"] = str(exc)
            except BaseException as exc:
                seen["error"] = exc

        thread = threading.Thread(target=read_in_another_thread)
        thread.start()
        thread.join()
        _expect("error" not in seen, f"{store.label}: reading in another thread raised {seen.get('error')!r}")
        _expect(seen["reply_to"] != name,
                f"{store.label}.reply_to() gave the same name, {name!r}, in two threads")
        _expect(seen["meta"].get("status") == PENDING,
                f"{store.label}: another thread read {seen['meta']!r} for a task this thread sent")
        _expect(mine in seen.get("timeout", ""),
                f"{store.label}: waiting in another thread for a task this thread sent should end in a "
                f"ResultTimeout naming it; got {seen!r}")


def _installed(serializer: str) -> bool:
    library = SERIALIZER_LIBRARIES.get(serializer)
    if library is None:
        return True
    try:
        importlib.import_module(library[0])
    except ImportError:
        return False
    return True


@_round_trips
def check_results_are_stored_in_each_result_serializer(backend: type[ResultBackend], url: str, *,
                                                       settings: Settings | None = None) -> None:
    """With ``result_serializer`` msgpack, yaml or pickle (those whose library is installed), or
    with the ``serializer`` a task gives ``store_result``, a value and an exception read back
    the same, through a backend whose own serializer is JSON, when ``result_accept_content``
    accepts them; a backend that does not accept the format refuses to read it with
    ``ResultError`` naming it and the setting; a promised final SUCCESS stays final."""
    accept = ("json", "msgpack", "yaml", "pickle")
    value = {"sum": 5, "items": [1, "two", None], "nested": {"ok": True}}
    error = encode_exception(ValueError("boom", 3))
    final: object = backend
    with _store(backend, url, settings) as store:
        reader = store.build(result_accept_content=accept)
        strict = store.build()
        for name in (serializer for serializer in accept[1:] if _installed(serializer)):
            writer = store.build(result_serializer=name, result_accept_content=accept)
            done, failed, given = store.new_id(), store.new_id(), store.new_id()
            writer.store_result(done, value, SUCCESS, None, store.asked(done, full_request(done), reader))
            writer.store_result(failed, error, FAILURE, "Traceback (most recent call last): ...",
                                store.asked(failed, full_request(failed), reader))
            reader.store_result(given, value, SUCCESS, None, store.asked(given, full_request(given), reader),
                                serializer=name)
            stored = ((done, SUCCESS, value), (failed, FAILURE, error), (given, SUCCESS, value))
            for task_id, state, result in stored:
                meta = store.meta(task_id, reader, until=state)
                _expect(meta.get("status") == state and meta.get("result") == result
                        and meta.get("task_id") == task_id and meta.get("parent_id") == "contract-parent",
                        f"{store.label} stored {state} {result!r} in {name} and read back {dict(meta)!r}")
            if _replies(strict):  # the strict client is sent the same result
                writer.store_result(done, value, SUCCESS, None, store.asked(done, full_request(done), strict))
            try:
                seen = strict.get_task_meta(done)
                deadline = time.monotonic() + WAIT_TIMEOUT
                while _replies(strict) and seen.get("status") == PENDING and time.monotonic() < deadline:
                    time.sleep(0.01)
                    seen = strict.get_task_meta(done)
            except ResultError as exc:
                _expect(name in str(exc) and "result_accept_content" in str(exc),
                        f"{store.label}: refusing a {name} result it does not accept, say so and name "
                        f"result_accept_content: {exc}")
            else:
                raise AssertionError(f"{store.label} read a {name} result although only json is accepted: "
                                     f"{dict(seen)!r}")
            if isinstance(final, SuccessIsFinal) and final.success_is_final:
                writer.store_result(done, error, FAILURE, None, store.asked(done, None, reader))
                store.settle(writer, reader)
                _expect(store.meta(done, reader).get("status") == SUCCESS,
                        f"{store.label} promises success_is_final, yet a FAILURE stored in {name} after the "
                        f"SUCCESS left {dict(store.meta(done, reader))!r}")
def _count(chords: JoinsChords, label: str, group_id: str, task_id: str, index: int | None,
           state: str = SUCCESS, result: Any = None, claim_seconds: float = 30.0) -> Any:
    try:
        return chords.count_chord_part(group_id, task_id, index, state, result, claim_seconds=claim_seconds)
    except Exception as exc:
        raise AssertionError(f"{label}.count_chord_part() of task {task_id} at {index} in group {group_id} "
                             f"raised {exc!r}") from exc


@_when_offered(JoinsChords)
def check_a_chord_counts_each_part_once_and_one_count_claims_its_body_when_offered(
        backend: type[ResultBackend], url: str, *, settings: Settings | None = None) -> None:
    """With :class:`~worker_core.slots.JoinsChords`, as a worker counts a chord of three: a part
    recorded twice (a header task delivered again) counts once; the count that completes the
    chord, and only that one, gets a claim; the parts come back in ``group_index`` order (None
    last) with their states and results; once finished, a late copy changes nothing; a chord
    sent again under the same group id counts from the start."""
    declared: object = backend
    if not isinstance(declared, JoinsChords):
        return
    with _store(backend, url, settings) as store:
        chords = store.backend
        assert isinstance(chords, JoinsChords)
        group_id = store.new_group_id()
        first, second, last = _new_id(), _new_id(), _new_id()
        chords.set_chord_size(group_id, 3)
        failure = encode_exception(ValueError("part two"))
        counts = [_count(chords, store.label, group_id, second, 1, FAILURE, failure),
                  _count(chords, store.label, group_id, second, 1, FAILURE, failure),
                  _count(chords, store.label, group_id, last, None, SUCCESS, {"n": 3})]
        seen = [(c.ready, c.expected, c.claim) for c in counts]
        _expect(seen == [(1, 3, None), (1, 3, None), (2, 3, None)],
                f"{store.label}: two copies of one part and one more should count 1, 1, 2 of 3 without a "
                f"claim; got {counts!r}")
        completing = _count(chords, store.label, group_id, first, 0, SUCCESS, [1, "one"])
        _expect(completing.ready == 3 and completing.expected == 3 and bool(completing.claim),
                f"{store.label}: the count completing the chord should get a claim; got {completing!r}")
        again = _count(chords, store.label, group_id, first, 0, SUCCESS, [1, "one"])
        _expect(again.claim is None, f"{store.label}: a copy of the last part got a second claim while the "
                                     f"first is held: {again!r}")
        parts = chords.chord_parts(group_id)
        expected_parts = [(first, SUCCESS, [1, "one"]), (second, FAILURE, failure), (last, SUCCESS, {"n": 3})]
        _expect([tuple(part) for part in parts] == expected_parts,
                f"{store.label}.chord_parts() should give the parts in group_index order: "
                f"{expected_parts!r}; got {parts!r}")
        _expect(chords.finish_chord(group_id, str(completing.claim), sent=True) is True,
                f"{store.label}.finish_chord() with the claim held returned False")
        late = _count(chords, store.label, group_id, last, None, SUCCESS, {"n": 3})
        _expect(late.ready == -1 and late.claim is None,
                f"{store.label}: a part counted after the chord was finished should change nothing "
                f"(ready -1, no claim); got {late!r}")
        chords.set_chord_size(group_id, 1)
        rerun = _count(chords, store.label, group_id, _new_id(), 0)
        _expect(rerun.ready == 1 and rerun.expected == 1 and bool(rerun.claim),
                f"{store.label}: a chord sent again under the same group id should count from the start; "
                f"got {rerun!r}")


@_when_offered(JoinsChords)
def check_a_chord_claim_is_taken_once_lapses_and_survives_failures_when_offered(
        backend: type[ResultBackend], url: str, *, settings: Settings | None = None) -> None:
    """With :class:`~worker_core.slots.JoinsChords`: two threads storing a chord's last parts at
    once claim its body once; a claim not finished lapses after ``claim_seconds``, so a later
    copy of a header task claims it again (its holder was killed); ``add_to_chord`` raises the
    count awaited; a chord finished as failed (not sent) drops its size, so no later copy
    completes it."""
    declared: object = backend
    if not isinstance(declared, JoinsChords):
        return
    with _store(backend, url, settings) as store:
        chords = store.backend
        assert isinstance(chords, JoinsChords)
        for _ in range(5):
            group_id = store.new_group_id()
            chords.set_chord_size(group_id, 2)
            barrier = threading.Barrier(2)
            claims: list[Any] = []

            def count_one(index: int, group_id: str = group_id, barrier: threading.Barrier = barrier,
                          claims: list[Any] = claims) -> None:
                barrier.wait()
                other = store.build()  # another worker's instance
                assert isinstance(other, JoinsChords)
                claims.append(_count(other, store.label, group_id, _new_id(), index).claim)

            threads = [threading.Thread(target=count_one, args=(index,)) for index in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            _expect(len([claim for claim in claims if claim]) == 1,
                    f"{store.label}: two threads completing a chord at once got {claims!r}; exactly one "
                    f"claim is wanted")
        group_id = store.new_group_id()
        chords.set_chord_size(group_id, 1)
        chords.add_to_chord(group_id, 1)
        part = _new_id()
        counted = _count(chords, store.label, group_id, part, 0)
        _expect(counted.expected == 2 and counted.claim is None,
                f"{store.label}: after add_to_chord() a chord of one should await 2; got {counted!r}")
        held = _count(chords, store.label, group_id, _new_id(), 1, claim_seconds=1)
        _expect(bool(held.claim), f"{store.label}: the completing count got no claim: {held!r}")
        time.sleep(2.1)
        retaken = _count(chords, store.label, group_id, part, 0)
        _expect(bool(retaken.claim) and retaken.claim != held.claim,
                f"{store.label}: a claim of 1 s not finished should lapse, and a later copy of a part claim "
                f"the body again; got {retaken!r}")
        _expect(chords.finish_chord(group_id, str(held.claim), sent=True) is False,
                f"{store.label}.finish_chord() with a lapsed claim taken over returned True")
        _expect(chords.finish_chord(group_id, str(retaken.claim), sent=False) is True,
                f"{store.label}.finish_chord(sent=False) returned False")
        after = _count(chords, store.label, group_id, part, 0)
        _expect(after.expected is None and after.claim is None,
                f"{store.label}: after a failed chord's finish a copy of a part should find no size and "
                f"get no claim; got {after!r}")


def check_a_backend_that_discards_results_keeps_its_promise(backend: type[ResultBackend], url: str, *,
                                                            settings: Settings | None = None) -> None:
    """With :class:`~worker_core.slots.DiscardsResults`: every ``store_result`` the worker makes is
    accepted, reads raise ``BackendDisabled`` naming the task and saying how to configure one, and
    the other methods do nothing."""
    with _store(backend, url, settings) as store:
        if not _discards(store.backend):
            return
        task_id = _new_id()
        for state in (STARTED, SUCCESS, FAILURE, RETRY, REVOKED):
            store.backend.store_result(task_id, 1, state, None, full_request(task_id))
        store.backend.store_result(task_id, 1, REVOKED, None, None)
        store.backend.on_task_call(task_id)
        store.backend.forget(task_id)
        for read in (store.backend.get_task_meta, store.backend.wait_for):
            try:
                read(task_id)
            except BackendDisabled as exc:
                _expect(task_id in str(exc) and "result_backend" in str(exc),
                        f"{store.label}.{read.__name__}() should name the task and the result_backend "
                        f"setting: {exc}")
            else:
                raise AssertionError(f"{store.label} discards results, yet {read.__name__}() did not raise "
                                     f"BackendDisabled")
        store.backend.close()


@_when_offered(BackendCountsDeliveries)
def check_a_delivery_counter_counts_once_per_call_when_offered(backend: type[ResultBackend], url: str, *,
                                                               settings: Settings | None = None) -> None:
    """With :class:`~worker_core.slots.BackendCountsDeliveries`: a new counter counts from 1, each
    call adds one, another instance (another worker) adds to the same counter, calls from several
    threads at once lose none, and counters of other keys are apart."""
    declared: object = backend
    if not isinstance(declared, BackendCountsDeliveries):
        return
    with _store(backend, url, settings) as store:
        counters = store.backend
        assert isinstance(counters, BackendCountsDeliveries)
        key, other_key = f"contract-counter-{_new_id()}", f"contract-counter-{_new_id()}"
        counts = [counters.count_delivery(key, 60.0) for _ in range(2)]
        _expect(counts == [1, 2], f"{store.label}.count_delivery() counted {counts!r}, not [1, 2]")
        other = store.build()
        assert isinstance(other, BackendCountsDeliveries)
        third = other.count_delivery(key, 60.0)
        _expect(third == 3, f"{store.label}: another instance counted {third!r} after 2, not 3")
        threads = [threading.Thread(target=counters.count_delivery, args=(key, 60.0)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        last = counters.count_delivery(key, 60.0)
        _expect(last == 12, f"{store.label}: 3 counts, 8 from threads at once, then one more gave {last!r}, "
                            f"not 12")
        fresh = counters.count_delivery(other_key, 60.0)
        _expect(fresh == 1, f"{store.label}: a counter of another key started at {fresh!r}, not 1")


#: Every check, in a sensible order.
CHECKS: tuple[Check, ...] = (
    check_the_class_satisfies_the_result_backend_protocol,
    check_an_unknown_task_is_pending,
    check_a_success_is_stored_in_celerys_format,
    check_exception_states_store_celerys_exception_encoding,
    check_a_later_state_replaces_an_earlier_one,
    check_a_success_is_never_overwritten_when_promised,
    check_wait_for_returns_when_another_thread_stores,
    check_wait_for_returns_when_another_process_stores,
    check_wait_for_raises_result_timeout_after_its_timeout,
    check_on_task_call_then_wait_for,
    check_forget_deletes_a_result,
    check_a_closed_backend_can_be_used_again,
    check_an_instance_works_in_a_forked_child_and_still_in_its_parent,
    check_result_extended_stores_the_request_fields,
    check_store_result_takes_every_request_the_worker_passes,
    check_store_result_is_safe_from_several_threads,
    check_saved_groups_restore_as_saved_when_offered,
    check_a_chord_join_can_be_prepared_when_offered,
    check_only_the_client_that_sent_a_task_reads_it_when_offered,
    check_results_are_stored_in_each_result_serializer,
    check_a_chord_counts_each_part_once_and_one_count_claims_its_body_when_offered,
    check_a_chord_claim_is_taken_once_lapses_and_survives_failures_when_offered,
    check_a_delivery_counter_counts_once_per_call_when_offered,
    check_a_backend_that_discards_results_keeps_its_promise,
)


def check_name(check: Check) -> str:
    """A pytest id: the check's name without its ``check_`` prefix."""
    return check.__name__.removeprefix("check_")


def applies(check: Check, backend: type[ResultBackend]) -> bool:
    """Whether ``check`` says anything about ``backend``: a backend that discards results has no
    round trips to check, and one without an optional capability nothing of it to check."""
    capability = _OFFERED.get(check.__name__)
    if capability is not None and not isinstance(backend, capability):
        return False
    return check.__name__ not in _ROUND_TRIPS or not _discards(backend)


def run_all(backend: type[ResultBackend], url: str, *, settings: Settings | None = None,
            only: Iterable[str] | None = None) -> None:
    """Run every check that applies (or those named in ``only``) against ``backend`` at ``url``;
    raise on the first failure, naming the backend and the check."""
    wanted = set(only) if only is not None else None
    for check in CHECKS:
        if wanted is not None and check_name(check) not in wanted and check.__name__ not in wanted:
            continue
        if not applies(check, backend):
            continue
        try:
            check(backend, url, settings=settings)
        except AssertionError as exc:
            raise AssertionError(f"{_label(backend)} fails {check.__name__}: {exc}") from exc

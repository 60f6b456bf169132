"""The embedded result backend (results in the embedded SQLite file) and the disabled backend."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from worker_core.app.settings import Settings
from worker_core.exceptions import BackendDisabled, ResultError, ResultTimeout
from worker_core.results.disabled import DisabledBackend
from worker_core.results.embedded import EmbeddedBackend
from worker_core.results.meta import FAILURE, PENDING, STARTED, SUCCESS, decode_result, encode_exception
from worker_core.transports.embedded import EmbeddedTransport


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"embedded://{tmp_path}/results.db"


@pytest.fixture
def backend(url: str) -> Iterator[EmbeddedBackend]:
    backend = EmbeddedBackend(url, Settings())
    yield backend
    backend.close()


def test_stored_result_reads_back_in_celerys_layout(backend: EmbeddedBackend) -> None:
    value = {
        "when": datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc),
        "id": uuid.UUID(int=7),
        "price": Decimal("1.10"),
        "raw": b"\x00\xff",
    }
    backend.store_result("t1", value, SUCCESS, request={"parent_id": "p1", "group": "g1"})
    meta = backend.get_task_meta("t1")
    assert meta["result"] == value
    assert meta["status"] == SUCCESS
    assert (meta["task_id"], meta["parent_id"], meta["group_id"]) == ("t1", "p1", "g1")
    assert meta["traceback"] is None and meta["children"] == []
    assert datetime.fromisoformat(meta["date_done"]).tzinfo is not None


def test_failure_is_stored_with_celerys_exception_encoding(backend: EmbeddedBackend) -> None:
    backend.store_result("t1", encode_exception(KeyError("missing", 3)), FAILURE, traceback="Traceback ...")
    meta = backend.get_task_meta("t1")
    assert meta["result"] == {"exc_type": "KeyError", "exc_message": ["missing", 3], "exc_module": "builtins"}
    assert meta["traceback"] == "Traceback ..."
    error = decode_result(meta)
    assert isinstance(error, KeyError) and error.args == ("missing", 3)


def test_unknown_task_is_pending(backend: EmbeddedBackend) -> None:
    assert backend.get_task_meta("nobody")["status"] == PENDING
    assert backend.get_task_meta("nobody")["task_id"] == "nobody"


def test_success_is_never_overwritten_but_earlier_states_are(backend: EmbeddedBackend) -> None:
    backend.store_result("t1", None, STARTED)
    backend.store_result("t1", 42, SUCCESS)
    backend.store_result("t1", encode_exception(RuntimeError("late duplicate")), FAILURE)
    backend.store_result("t1", None, STARTED)
    meta = backend.get_task_meta("t1")
    assert (meta["status"], meta["result"]) == (SUCCESS, 42)


def test_results_expire_after_result_expires_seconds(url: str) -> None:
    backend = EmbeddedBackend(url, Settings(result_expires=0.2))
    backend.store_result("t1", 1, SUCCESS)
    assert backend.get_task_meta("t1")["status"] == SUCCESS
    time.sleep(0.3)  # the behaviour under test: past result_expires
    assert backend.get_task_meta("t1")["status"] == PENDING
    backend.store_result("t1", 2, SUCCESS)  # an expired SUCCESS no longer blocks a new one
    assert backend.get_task_meta("t1")["result"] == 2
    backend.close()


def test_results_never_expire_when_result_expires_is_none(url: str) -> None:
    backend = EmbeddedBackend(url, Settings(result_expires=None))
    backend.store_result("t1", 1, SUCCESS)
    assert backend.get_task_meta("t1")["result"] == 1
    backend.close()


def test_forget_deletes_the_result(backend: EmbeddedBackend) -> None:
    backend.store_result("t1", 1, SUCCESS)
    backend.forget("t1")
    assert backend.get_task_meta("t1")["status"] == PENDING


def test_wait_for_returns_as_soon_as_another_process_stores_the_result(
    backend: EmbeddedBackend, url: str
) -> None:
    code = textwrap.dedent(
        """
        import sys, time
        from worker_core.app.settings import Settings
        from worker_core.results.embedded import EmbeddedBackend
        backend = EmbeddedBackend(sys.argv[1], Settings())
        time.sleep(0.3)  # stored a while later: the waiting under test
        backend.store_result("t1", "done", "SUCCESS")
        print(time.time(), flush=True)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, text=True)
    try:
        meta = backend.wait_for("t1", timeout=10, interval=0.05)
        returned = time.time()
        stored = float(process.communicate(timeout=10)[0])
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
    assert meta["result"] == "done"
    assert returned - stored < 0.2


def test_wait_for_gives_up_with_the_tasks_state_after_the_timeout(backend: EmbeddedBackend) -> None:
    backend.store_result("t1", None, STARTED)
    started = time.monotonic()
    with pytest.raises(ResultTimeout, match=r"task t1 did not finish within 0.3s \(state: STARTED\)"):
        backend.wait_for("t1", timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 0.6


def test_results_stored_by_a_forked_child_are_read_by_the_parent(backend: EmbeddedBackend) -> None:
    backend.store_result("parent", 1, SUCCESS)  # the parent's connection is open before the fork
    pid = os.fork()
    if pid == 0:
        try:
            backend.store_result("child", os.getpid(), SUCCESS)
            os._exit(0 if backend.get_task_meta("parent")["result"] == 1 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.get_task_meta("child")["result"] == pid
    backend.store_result("parent-again", 2, SUCCESS)  # the parent's connection still works
    assert backend.get_task_meta("parent-again")["result"] == 2


def test_results_stored_from_many_threads_at_once_are_all_kept(backend: EmbeddedBackend) -> None:
    def store(thread: int) -> None:
        for n in range(50):
            backend.store_result(f"{thread}-{n}", n, SUCCESS)

    threads = [threading.Thread(target=store, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(backend.get_task_meta(f"{t}-{n}")["result"] == n for t in range(8) for n in range(50))


def test_results_share_the_transports_file(tmp_path: Path) -> None:
    broker = f"embedded://{tmp_path}/shared.db"
    backend = EmbeddedBackend(EmbeddedTransport.default_result_backend(broker) or "", Settings())
    assert backend.path == EmbeddedTransport(broker, Settings()).path
    backend.close()


def test_a_file_that_is_not_a_database_gives_a_result_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "not.db"
    path.write_bytes(b"this is not sqlite" * 100)
    backend = EmbeddedBackend(f"embedded://{path}", Settings())
    with pytest.raises(ResultError, match=r"not\.db"):
        backend.get_task_meta("t1")


# -- the disabled backend ---------------------------------------------------------------------------


def test_disabled_backend_stores_nothing_and_says_how_to_configure_one() -> None:
    backend = DisabledBackend("disabled", Settings())
    backend.on_task_call("t1")
    backend.store_result("t1", 1, SUCCESS)
    backend.forget("t1")
    for read in (backend.get_task_meta, backend.wait_for):
        with pytest.raises(BackendDisabled) as caught:
            read("t1")
        message = str(caught.value)
        assert "no result backend is configured" in message
        assert "backend=" in message and "result_backend" in message and "WORKER_RESULT_BACKEND" in message
    backend.close()

"""Revoking tasks by id (Celery's ``revoke`` and ``terminate``): discarded when they arrive,
discarded at once while they wait, killed while they run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import pytest
from apps import basic
from workers import TESTS, ask, children_of, wait_for

from worker_core.control.commands import signal_number
from worker_core.exceptions import TaskRevokedError
from worker_core.revoked import RevokedIds


def test_revoked_ids_expire_and_the_oldest_go_past_the_limit():
    now = [0.0]
    ids = RevokedIds(maxlen=3, expires=10, clock=lambda: now[0])
    ids.add(["a", "b"])
    now[0] = 5
    ids.add(["c", "d"])
    assert list(ids) == ["b", "c", "d"] and "a" not in ids
    now[0] = 6
    ids.add(["b"])  # revoked again: it counts from now
    now[0] = 12
    assert "c" in ids and "b" in ids
    now[0] = 15
    assert "c" not in ids and list(ids) == ["b"]
    now[0] = 16
    assert not ids and len(ids) == 0


@pytest.mark.parametrize(("given", "number"), [
    ("TERM", signal.SIGTERM), ("sigkill", signal.SIGKILL), ("KILL", signal.SIGKILL), ("9", 9),
    (signal.SIGUSR1.value, signal.SIGUSR1),
])
def test_signals_are_taken_by_name_or_number(given, number):
    assert signal_number(given) == number


@pytest.mark.parametrize("given", ["NOPE", "SIG_IGN", "999", 999, 1.5, None])
def test_a_bad_signal_is_refused_with_what_to_give(given):
    with pytest.raises(ValueError, match="signal"):
        signal_number(given)


def _received(worker, result) -> None:
    wait_for(lambda: f"[{result.id}] received" in worker.log(), message=f"{result.id} to arrive")


@pytest.fixture
def start(workers, embedded_broker):
    def start(pool: str, *args: str):
        return workers.start(*args, pool=pool, broker=embedded_broker, env={"PYTHONPATH": str(TESTS)})

    return start


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_task_waiting_for_its_countdown_is_discarded_at_once(start, pool, tmp_path):
    proof = tmp_path / "ran"
    worker = start(pool)
    result = basic.record.apply_async((str(proof), "x"), countdown=30)
    _received(worker, result)
    assert ask(basic.app, "revoke", task_id=result.id) == {"ok": f"tasks { {result.id} } flagged as revoked"}
    with pytest.raises(TaskRevokedError, match="revoked"):
        result.get(timeout=10)
    assert result.state == "REVOKED"
    assert ask(basic.app, "scheduled") == []
    assert ask(basic.app, "revoked") == [result.id]
    worker.wait_log(f"Discarding revoked task: apps.basic.record[{result.id}] (revoked)")
    assert basic.add.delay(1, 2).get(timeout=20) == 3  # its window slot was given back
    assert not proof.exists()


@pytest.mark.parametrize(("pool", "scheduling"),
                         [("prefork", "fair"), ("prefork", "fcfs"), ("threads", "fair")])
def test_a_task_waiting_in_the_pool_behind_a_busy_one_is_discarded_at_once(start, pool, scheduling, tmp_path):
    proof = tmp_path / "ran"
    worker = start(pool, "-c", "1", "-O", scheduling)
    busy = basic.sleep.delay(3)
    revoked = basic.record.apply_async((str(proof), "revoked"))
    kept = basic.record.apply_async((str(proof), "kept"))
    _received(worker, kept)
    started = time.monotonic()
    assert ask(basic.app, "revoke", task_id=revoked.id) == {
        "ok": f"tasks { {revoked.id} } flagged as revoked"}
    with pytest.raises(TaskRevokedError, match="revoked"):
        revoked.get(timeout=10)
    assert time.monotonic() - started < 2  # the busy task still runs: it was not waited for
    worker.wait_log(f"Discarding revoked task: apps.basic.record[{revoked.id}] (revoked)")
    assert busy.get(timeout=20) == 3 and kept.get(timeout=20) == "kept"
    assert basic.lines(proof) == ["kept"]


def test_a_task_revoked_before_it_arrives_is_marked_at_once_and_discarded_when_it_comes(start, tmp_path):
    proof = tmp_path / "ran"
    worker = start("solo")
    task_id = str(uuid.uuid4())
    ask(basic.app, "revoke", task_id=[task_id])
    with pytest.raises(TaskRevokedError):  # the client stops waiting before the message is even sent
        basic.app.AsyncResult(task_id).get(timeout=10)
    basic.record.apply_async((str(proof), "x"), task_id=task_id)
    assert basic.add.delay(2, 2).get(timeout=20) == 4  # sent after it, so it has been handled
    worker.wait_log(f"Discarding revoked task: apps.basic.record[{task_id}] (revoked)")
    assert not proof.exists()


def test_terminate_kills_the_process_running_the_task_and_marks_it_revoked(start):
    worker = start("prefork", "-c", "2")
    before = set(children_of(worker.pid))
    result = basic.sleep.delay(30)
    wait_for(lambda: ask(basic.app, "query_task", ids=[result.id]).get(result.id, [None])[0] == "active",
             message="the task to start")
    answer = ask(basic.app, "revoke", task_id=result.id, terminate=True, signal="KILL")
    assert answer == {"ok": f"terminate: {result.id}"}
    with pytest.raises(TaskRevokedError, match="terminated"):
        result.get(timeout=10)
    worker.wait_log(f"Terminating {result.id} (SIGKILL)")
    wait_for(lambda: len(children_of(worker.pid)) == 2 and set(children_of(worker.pid)) != before,
             message="the killed child to be replaced")
    assert basic.add.delay(3, 4).get(timeout=20) == 7
    assert ask(basic.app, "query_task", ids=[result.id]) == {}


def test_terminate_before_the_task_starts_takes_it_back_without_killing_a_process(start):
    # fcfs: the second job waits in the only child's pipe, in the pool but not started
    worker = start("prefork", "-c", "1", "-O", "fcfs")
    blocker = basic.sleep.delay(1.5)
    result = basic.sleep.delay(30)
    _received(worker, result)
    child = children_of(worker.pid)
    assert ask(basic.app, "query_task", ids=[result.id])[result.id][0] == "reserved"
    assert ask(basic.app, "terminate", signal="TERM", task_id=[result.id]) == {
        "ok": f"terminate: {result.id}"}
    with pytest.raises(TaskRevokedError, match="revoked"):
        result.get(timeout=1)  # at once: the blocker still runs
    assert blocker.get(timeout=20) == 1.5
    assert children_of(worker.pid) == child
    assert basic.add.delay(1, 1).get(timeout=20) == 2


def test_terminate_on_a_pool_that_cannot_stop_a_task_says_so_and_the_task_completes(start):
    start("threads", "-c", "2")
    result = basic.sleep.delay(2)
    wait_for(lambda: ask(basic.app, "query_task", ids=[result.id]).get(result.id, [None])[0] == "active",
             message="the task to start")
    answer = ask(basic.app, "revoke", task_id=result.id, terminate=True)
    assert answer == {"error": f"cannot terminate {result.id}: the threads pool cannot stop a running "
                               "task: threads can be neither interrupted nor killed; use -P prefork to "
                               "terminate tasks"}
    assert result.get(timeout=20) == 2


#: Pools that hold back every report of a task's start until the test opens a gate: the task
#: runs, but the worker has not heard of it yet (a revoke lands between the two).
GATED_POOLS = """
    import os
    import threading
    from pathlib import Path

    from worker_pool_prefork.pool import PreforkPool
    from worker_pool_threads.pool import ThreadPool
    from workers import wait_for

    GATE = Path(os.environ["GATE_DIR"])


    def gated(report):
        def held(pid, started):
            (GATE / "held").write_text(str(pid))

            def release():  # the task is held until the test opens the gate
                wait_for((GATE / "open").exists, 60, interval=0.01, message="the test to open the gate")
                report(pid, started)

            threading.Thread(target=release, daemon=True).start()

        return held


    class Gated:
        def apply_async(self, target, args=(), kwargs=None, *, accept_callback=None, **options):
            return super().apply_async(target, args, kwargs, accept_callback=gated(accept_callback),
                                       **options)


    class GatedPrefork(Gated, PreforkPool):
        pass


    class GatedThreads(Gated, ThreadPool):
        pass
"""


@pytest.fixture
def gated(workers, embedded_broker, site, tmp_path):
    site.add("worker-pool-gated", {"worker.pools": {"gated-prefork": "gated_pools:GatedPrefork",
                                                    "gated-threads": "gated_pools:GatedThreads"}},
             {"gated_pools": GATED_POOLS})
    gate = tmp_path / "gate"
    gate.mkdir()

    def start(pool: str):
        worker = workers.start("-c", "1", pool=pool, broker=embedded_broker,
                               env={"PYTHONPATH": f"{site.root}:{TESTS}", "GATE_DIR": str(gate)})
        return worker, gate

    return start


def _held_start(worker, gate, result) -> int:
    """Wait until the task runs but its start is held back; the pid running it."""
    wait_for(lambda: (gate / "held").exists(), message="the task to start")
    assert ask(basic.app, "query_task", ids=[result.id])[result.id][0] == "reserved"  # not heard of yet
    return int((gate / "held").read_text())


def test_terminate_as_the_task_starts_kills_its_process_once_the_start_is_reported(gated):
    worker, gate = gated("gated-prefork")
    result = basic.sleep.delay(30)
    pid = _held_start(worker, gate, result)
    # too late to take it back from the pool, too early to know its process: killed when it reports
    assert ask(basic.app, "terminate", signal="KILL", task_id=[result.id]) == {
        "ok": f"terminate: {result.id}"}
    assert pid in children_of(worker.pid) and not result.ready()
    (gate / "open").touch()
    with pytest.raises(TaskRevokedError, match="terminated"):
        result.get(timeout=10)
    worker.wait_log(f"Task apps.basic.sleep[{result.id}] started after it was revoked with terminate: "
                    f"stopping process {pid}")
    wait_for(lambda: pid not in children_of(worker.pid) and len(children_of(worker.pid)) == 1,
             message="the killed child to be replaced")
    assert basic.add.delay(2, 5).get(timeout=20) == 7
    assert ask(basic.app, "query_task", ids=[result.id]) == {}


def test_terminate_as_the_task_starts_on_a_pool_that_cannot_stop_it_warns_and_the_task_completes(gated):
    worker, gate = gated("gated-threads")
    result = basic.sleep.delay(0.5)
    _held_start(worker, gate, result)
    assert ask(basic.app, "terminate", task_id=[result.id]) == {"ok": f"terminate: {result.id}"}
    (gate / "open").touch()
    assert result.get(timeout=20) == 0.5
    worker.wait_log(f"Could not terminate apps.basic.sleep[{result.id}] (the threads pool cannot stop a "
                    "running task")
    assert basic.add.delay(2, 5).get(timeout=20) == 7


@pytest.mark.parametrize(("arguments", "error"), [
    ({"task_id": 5}, "revoke: task_id must be a task id or a list of them (got 5)"),
    ({"task_id": []}, "revoke: task_id must be a task id or a list of them (got [])"),
    ({"task_id": "x", "terminate": True, "signal": "NOPE"}, "revoke: unknown signal 'NOPE'"),
])
def test_bad_revoke_arguments_get_an_error_and_change_nothing(start, arguments, error):
    start("solo")
    answer = ask(basic.app, "revoke", **arguments)
    assert isinstance(answer, dict) and answer["error"].startswith(error)
    assert ask(basic.app, "revoked") == []


def test_workerctl_revokes_and_lists_revoked_ids(start, embedded_broker, tmp_path):
    worker = start("solo")
    result = basic.record.apply_async((str(tmp_path / "ran"), "x"), countdown=30)
    _received(worker, result)

    def workerctl(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "worker_core", *args, "-b", embedded_broker, "-t", "3"],
                              capture_output=True, text=True, timeout=60, cwd=TESTS)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert f"tasks { {result.id} } flagged as revoked" in workerctl("control", "revoke", result.id)
    assert result.id in workerctl("inspect", "revoked")
    with pytest.raises(TaskRevokedError):
        result.get(timeout=10)


def test_revoked_ids_saved_and_loaded_keep_their_age(tmp_path):
    now = [100.0]
    ids = RevokedIds(expires=10, clock=lambda: now[0])
    ids.add(["old"])
    now[0] = 106.0
    ids.add(["new"])
    path = str(tmp_path / "state.json")
    ids.save(path)
    later = [5000.0]  # another process: its monotonic clock says something else entirely
    loaded = RevokedIds(expires=10, clock=lambda: later[0])
    assert loaded.load(path) == 2 and list(loaded) == ["old", "new"]
    later[0] += 5  # "old" was revoked 11 s ago now, "new" 5 s ago
    assert "old" not in loaded and "new" in loaded
    assert RevokedIds().load(str(tmp_path / "missing.json")) == 0


@pytest.mark.parametrize(("content", "error"), [
    ("{not json", "cannot read the state file"),
    ('{"clock": 3}', "does not hold revoked task ids"),
    ('{"revoked": {"a": "yesterday"}}', "does not hold revoked task ids"),
    ('{"revoked": {}, "clock": "late"}', "holds a clock that is not a whole number"),
])
def test_a_state_file_that_is_not_ours_is_refused(tmp_path, content, error):
    path = tmp_path / "state.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=error):
        RevokedIds().load(str(path))


def test_a_state_file_celery_s_worker_wrote_is_named_as_such(tmp_path):
    import shelve

    path = str(tmp_path / "w1.state")
    with shelve.open(path) as db:  # what Celery's worker keeps there
        db["clock"] = 7
    written = next(p for p in tmp_path.iterdir())  # dbm may add a suffix: Celery's -S names that file
    with pytest.raises(ValueError, match=r"is a dbm.* database, as Celery's worker writes it"):
        RevokedIds().load(str(written))


def test_with_statedb_revoked_ids_survive_a_restart(start, tmp_path):
    state = tmp_path / "worker.state"
    proof = tmp_path / "ran"
    worker = start("solo", "--statedb", str(state))
    task_id = str(uuid.uuid4())
    ask(basic.app, "revoke", task_id=task_id)
    assert task_id in state.read_text()  # written at once, not only at a clean shutdown
    worker.stop()
    kept = json.loads(state.read_text())["clock"]
    assert kept >= 1  # the revoke request moved it
    worker = start("solo", "-S", str(state))
    worker.wait_log(f"Loaded 1 revoked task id(s) and the logical clock ({kept}) from")
    assert ask(basic.app, "clock")["clock"] > kept  # the clock goes on from where it was, as in Celery
    assert ask(basic.app, "revoked") == [task_id]
    basic.record.apply_async((str(proof), "x"), task_id=task_id)
    assert basic.add.delay(1, 1).get(timeout=20) == 2
    worker.wait_log(f"Discarding revoked task: apps.basic.record[{task_id}] (revoked)")
    assert not proof.exists()


@pytest.mark.parametrize(("make", "error"), [
    (lambda tmp: str(tmp / "nowhere" / "state"), "the directory"),
    (lambda tmp: str(tmp), "is a directory"),
    (lambda tmp: (tmp / "bad").write_text("{oops") and str(tmp / "bad"), "cannot read the state file"),
])
def test_a_bad_statedb_stops_before_anything_starts(tmp_path, embedded_broker, make, error):
    import os

    from workers import WorkerProcess

    env = dict(os.environ, WORKER_BROKER_URL=embedded_broker)
    worker = WorkerProcess(["-A", "apps.basic", "--statedb", make(tmp_path)], env, tmp_path / "bad.log",
                           cwd=TESTS)
    try:
        assert worker.process.wait(timeout=20) == 2, worker.log()
        assert "--statedb" in worker.log() and error in worker.log() and "Traceback" not in worker.log()
    finally:
        worker.kill()

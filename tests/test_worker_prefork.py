"""The prefork pool inside a real worker: killed children, time limits, recycling, no orphans."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from apps import basic
from workers import TESTS, ask, children_of, wait_for

from worker_core.exceptions import TimeLimitExceeded, WorkerLostError


@pytest.fixture
def start(workers, embedded_broker):
    def start(*args: str):
        return workers.start("-c", "2", *args, pool="prefork", broker=embedded_broker,
                             env={"PYTHONPATH": str(TESTS)})

    return start


def test_a_child_killed_mid_task_fails_it_with_worker_lost_and_is_replaced(start, tmp_path):
    worker = start()
    before = set(children_of(worker.pid))
    result = basic.die.delay(str(tmp_path / "marker"))
    with pytest.raises(WorkerLostError, match="signal 9"):
        result.get(timeout=30)
    worker.wait_log("exited with 'signal 9 (SIGKILL)'")
    assert basic.add.delay(1, 2).get(timeout=30) == 3
    wait_for(lambda: len(children_of(worker.pid)) == 2, message="the child to be replaced")
    assert set(children_of(worker.pid)) != before


def test_with_acks_late_and_reject_on_worker_lost_the_task_runs_again(start, tmp_path):
    start()
    marker = tmp_path / "marker"
    assert basic.die_once.delay(str(marker)).get(timeout=30) == "survived"
    assert marker.read_text() == "died"


def test_the_soft_limit_raises_inside_the_task_which_can_clean_up(start):
    worker = start()
    assert basic.soft_limited.delay(5).get(timeout=30) == "cleaned up after the soft limit"
    worker.wait_log("Soft time limit (0.5s) exceeded for apps.basic.soft_limited")


def test_the_hard_limit_kills_the_child_and_fails_the_task(start):
    worker = start()
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        basic.hard_limited.delay(30).get(timeout=30)
    assert time.monotonic() - started < 10
    worker.wait_log("Hard time limit (0.5s) exceeded for apps.basic.hard_limited")
    assert basic.add.delay(2, 2).get(timeout=30) == 4


def test_children_are_recycled_after_max_tasks_per_child(start):
    start("--max-tasks-per-child", "2")
    pids = [basic.pid.delay().get(timeout=30) for _ in range(8)]
    assert len(set(pids)) >= 4  # two children, each replaced after two tasks


def test_children_are_recycled_above_max_memory_per_child(start):
    start("-c", "1", "--max-memory-per-child", str(80 * 1024))
    first = basic.hog.delay(120).get(timeout=30)
    second = basic.pid.delay().get(timeout=30)
    assert first != second


def test_warm_shutdown_leaves_no_child_processes(start):
    worker = start()
    assert basic.add.delay(1, 1).get(timeout=30) == 2
    children = children_of(worker.pid)
    assert len(children) == 2
    assert worker.stop(signal.SIGTERM) == 0
    for child in children:
        assert (
            not Path(f"/proc/{child}").exists()
            or "zombie" in Path(f"/proc/{child}/status").read_text().lower()
        )


def test_sigterm_to_every_process_at_once_lets_the_running_task_finish(start, tmp_path):
    """What systemd's default KillMode=control-group does on stop: the children leave the
    decision to the worker, whose warm shutdown waits for the task instead of losing it."""
    worker = start()
    proof = tmp_path / "ran.txt"
    result = basic.record_slowly.delay(str(proof), "finished", 1.0)
    wait_for(lambda: ask(basic.app, "active"), message="the task to run")
    children = children_of(worker.pid)
    for pid in (worker.pid, *children):
        os.kill(pid, signal.SIGTERM)
    assert worker.process.wait(timeout=30) == 0
    assert basic.lines(proof) == ["finished"]
    assert result.get(timeout=10) == "finished"
    log = worker.log()
    assert "ignored a SIGTERM the worker did not send" in log
    assert "WorkerLostError" not in log and "signal 15" not in log


def test_cold_shutdown_kills_children_and_acks_late_work_comes_back(start, tmp_path):
    worker = start()
    proof = tmp_path / "ran.txt"
    result = basic.record_slowly.delay(str(proof), "late", 5)
    wait_for(lambda: ask(basic.app, "active"), message="the task to run")
    children = children_of(worker.pid)
    worker.signal(signal.SIGQUIT)
    assert worker.process.wait(timeout=15) == 0
    for child in children:
        wait_for(lambda child=child: not Path(f"/proc/{child}").exists(), message=f"child {child} to exit")
    assert basic.lines(proof) == []
    start()
    assert result.get(timeout=30) == "late"


def test_the_pool_grows_and_shrinks_on_command_under_load(start, embedded_broker):

    worker = start()
    running = [basic.sleep.delay(1.0) for _ in range(4)]
    assert ask(basic.app, "pool_grow", n=2) == {"ok": "pool will grow"}
    wait_for(lambda: len(children_of(worker.pid)) == 4, message="four children")
    assert [r.get(timeout=30) for r in running] == [1.0] * 4
    assert ask(basic.app, "pool_shrink", n=3) == {"ok": "pool will shrink"}
    wait_for(lambda: len(children_of(worker.pid)) == 1, message="one child")
    assert basic.add.delay(3, 4).get(timeout=30) == 7


def test_a_task_that_kills_its_process_every_time_stops_after_the_redelivery_limit(
        workers, embedded_broker, tmp_path):
    worker = workers.start("-c", "2", pool="prefork", broker=embedded_broker,
                           env={"PYTHONPATH": str(TESTS), "WORKER_WORKER_REDELIVERY_LIMIT": "3"})
    counter = tmp_path / "runs"
    result = basic.always_die.delay(str(counter))
    with pytest.raises(WorkerLostError,
                       match=r"died 4 times, so it is not run again \(worker_redelivery_limit=3\)"):
        result.get(timeout=60)
    assert counter.read_text() == "xxxx"  # the first run and three more
    assert worker.log().count("sending it again") == 3
    assert basic.add.delay(5, 5).get(timeout=30) == 10


def test_the_time_limit_command_sets_a_tasks_limits_for_the_tasks_that_start_next(start):

    worker = start()
    assert ask(basic.app, "time_limit", task_name="apps.basic.sleep", hard=0.5) == {
        "ok": "time limits set successfully"}
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        basic.sleep.delay(30).get(timeout=30)
    assert time.monotonic() - started < 10
    worker.wait_log("New time limits for tasks of type apps.basic.sleep: soft=None hard=0.5")
    assert ask(basic.app, "time_limit", task_name="apps.basic.sleep", soft=2, hard=1) == {
        "error": "soft_time_limit (2s) must be shorter than time_limit (1s): "
                 "the soft limit warns the task before the hard limit kills it"}
    assert ask(basic.app, "time_limit", task_name="apps.basic.sleep") == {
        "ok": "time limits set successfully"}
    assert ask(basic.app, "time_limit", task_name="apps.basic.slep", hard=1) == {
        "error": "unknown task 'apps.basic.slep'. Did you mean 'apps.basic.sleep'?"}
    assert basic.sleep.delay(1).get(timeout=30) == 1  # limits lifted again

"""The threads pool: options it refuses, limits it ignores, size changes, recycling, shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from workers import wait_for

from worker_core.exceptions import ConfigurationError, PoolError, WorkerLostError
from worker_core.slots import PoolOptions
from worker_core.testing import PoolRunner, jobs
from worker_pool_threads import ThreadPool


def thread_name() -> str:
    return threading.current_thread().name


def failing_initializer() -> None:
    raise RuntimeError("no database (test)")


@pytest.fixture
def release(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "release")
    yield path
    Path(path).touch()


@pytest.mark.parametrize("limits", [{"time_limit": 10.0}, {"soft_time_limit": 5.0}])
def test_check_options_refuses_time_limits(limits: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot enforce time limits .*use -P prefork"):
        ThreadPool.check_options(PoolOptions(concurrency=2, **limits))


def test_check_options_refuses_a_memory_limit() -> None:
    with pytest.raises(ConfigurationError, match=r"max_memory_per_child=1000.*use -P prefork"):
        ThreadPool.check_options(PoolOptions(concurrency=2, max_memory_per_child=1000))


@pytest.mark.parametrize("scheduling", ["fair", "fcfs"])
def test_scheduling_is_accepted_and_means_a_shared_queue(scheduling: str, release: str) -> None:
    with PoolRunner(ThreadPool, PoolOptions(concurrency=2, scheduling=scheduling)) as runner:
        long = runner.submit(jobs.wait_for_path, (release,)).wait_accepted()
        short = [runner.submit(jobs.add, (index, 1)) for index in range(5)]
        assert all(probe.wait(5.0).result is not None for probe in short)
        assert not long.done.is_set()
        Path(release).touch()
        runner.stop()


def test_per_job_limits_are_ignored_with_one_warning_per_task(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="worker.pool")
    with PoolRunner(ThreadPool, PoolOptions(concurrency=2)) as runner:
        probes = [runner.submit(jobs.sleep, (0.01,), timeout=0.001, name="proj.slow") for _ in range(3)]
        probes.append(runner.submit(jobs.add, (1, 1), soft_timeout=1.0, name="proj.other"))
        probes.append(runner.submit(jobs.add, (1, 1), soft_timeout=1.0))
        for probe in probes:
            probe.wait()
            assert probe.kinds() == ["accept", "result"]
        runner.stop()
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert any("proj.slow" in message and "are ignored" in message for message in warnings)
    assert any("worker_core.testing.jobs.add" in message for message in warnings)


def test_grow_and_shrink_under_load(release: str) -> None:
    with PoolRunner(ThreadPool, PoolOptions(concurrency=2)) as runner:
        pool = runner.pool
        held = [runner.submit(jobs.wait_for_path, (release,)) for _ in range(2)]
        for probe in held:
            probe.wait_accepted()
        with pytest.raises(PoolError, match="all 2 threads are busy"):
            pool.shrink(1)
        pool.grow(2)
        assert pool.num_processes == 4
        for probe in [runner.submit(jobs.add, (index, 1)) for index in range(4)]:
            probe.wait(5.0)
        wait_for(lambda: pool.info()["idle"] >= 2, 5, interval=0.01, message="two idle threads")
        pool.shrink(2)
        assert pool.num_processes == 2
        wait_for(lambda: pool.info()["threads"] == 2, 5, interval=0.01, message="two threads")
        Path(release).touch()
        for probe in held:
            assert probe.wait().result == "released"
        runner.stop()


def test_shrink_right_after_grow_retires_threads_still_starting() -> None:
    gate = threading.Event()
    gate.set()
    with PoolRunner(ThreadPool, PoolOptions(concurrency=1, initializer=lambda: gate.wait(5))) as runner:
        pool = runner.pool
        gate.clear()  # the threads grow() starts stay in their initializer until the gate opens
        pool.grow(3)
        pool.shrink(3)
        assert pool.num_processes == 1
        gate.set()
        wait_for(lambda: pool.info()["threads"] == 1, 5, interval=0.01, message="the pool down to one thread")
        assert runner.submit(jobs.add, (2, 3)).wait(5.0).result == 5
        runner.stop()


def test_max_tasks_per_child_replaces_the_thread_and_reruns_the_initializer() -> None:
    calls: list[str] = []
    options = PoolOptions(concurrency=1, max_tasks_per_child=2,
                          initializer=lambda: calls.append(thread_name()))
    with PoolRunner(ThreadPool, options) as runner:
        names = [runner.submit(thread_name).wait().result for _ in range(5)]
        assert names[0] == names[1] != names[2] == names[3] != names[4]
        assert calls == [names[0], names[2], names[4]]
        runner.stop()


def test_stop_waits_for_queued_and_running_jobs() -> None:
    with PoolRunner(ThreadPool, PoolOptions(concurrency=2)) as runner:
        probes = [runner.submit(jobs.sleep, (0.05,)) for _ in range(8)]
        runner.stop()
        assert all(probe.kinds() == ["accept", "result"] for probe in probes)
        assert runner.pool.info()["threads"] == 0
        with pytest.raises(PoolError, match="stopped"):
            runner.pool.apply_async(jobs.noop)


def test_terminate_does_not_hang_on_a_stuck_thread(release: str) -> None:
    with PoolRunner(ThreadPool, PoolOptions(concurrency=1)) as runner:
        stuck = runner.submit(jobs.wait_for_path, (release,)).wait_accepted()
        queued = [runner.submit(jobs.add, (index, 1)) for index in range(3)]
        began = time.monotonic()
        runner.terminate()
        assert time.monotonic() - began < 1.0
        assert "abandoned" in str(stuck.error)
        for probe in queued:
            assert isinstance(probe.error, WorkerLostError) and "never started" in str(probe.error)
        Path(release).touch()  # the abandoned thread finishes now: its late result is dropped
        time.sleep(0.1)  # a negative: time for its late result to show, were it not dropped
        assert stuck.kinds() == ["accept", "error"]


def test_failing_initializer_reports_a_bad_start(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="worker.pool")
    with PoolRunner(ThreadPool, PoolOptions(concurrency=2, initializer=failing_initializer)) as runner:
        assert runner.pool.did_start_ok() is False
        assert "no database (test)" in caplog.text
        runner.stop()


def test_terminate_job_is_refused() -> None:
    pool = ThreadPool(PoolOptions(concurrency=1))
    with pytest.raises(PoolError, match="cannot stop a running task"):
        pool.terminate_job(1)

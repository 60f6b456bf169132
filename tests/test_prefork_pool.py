"""The prefork pool with real child processes, driven by its own thread and by a kombu hub.

Every test starts its pool through ``PoolRunner``, which terminates it on the way out even
when the test fails, so no child outlives a test.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from workers import wait_for

from worker_core.exceptions import ConfigurationError, PoolError, TimeLimitExceeded, WorkerLostError
from worker_core.slots import PoolOptions
from worker_core.testing import PoolRunner, jobs
from worker_pool_prefork import PreforkPool, engine

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests use /proc")

DRIVERS = ["thread", "hub"]


# -- helpers ------------------------------------------------------------------------------------


def child_pids() -> set[int]:
    """Children of this test process, zombies included (from /proc/<pid>/task/*/children)."""
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:
            pass
    return pids


def resident_kib() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def process_name() -> str:
    import billiard

    return str(billiard.current_process().name)


def failing_initializer() -> None:
    raise RuntimeError("database unreachable (test)")


def ignore_sigterm_then_sleep(ready: str, seconds: float) -> float:
    """Ignore SIGTERM, say so by creating ``ready``, then sleep.

    The child reports a job accepted before the job's code runs, so a test that signals on
    acceptance alone may reach the child before it ignores anything; ``ready`` closes that gap.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(ready).touch()
    time.sleep(seconds)  # the job itself: a long task
    return seconds


@pytest.fixture
def release(tmp_path: Path) -> Iterator[str]:
    """A path blocking jobs wait for; created at teardown so no child stays blocked."""
    path = str(tmp_path / "release")
    yield path
    Path(path).touch()


def run_pool(options: PoolOptions, driver: str, **kwargs: float) -> PoolRunner:
    def factory(opts: PoolOptions) -> PreforkPool:
        return PreforkPool(opts, **kwargs)

    factory.check_options = PreforkPool.check_options  # type: ignore[attr-defined]
    return PoolRunner(factory, options, hub=driver == "hub")


def processes(runner: PoolRunner) -> list[int]:
    return list(runner.call(runner.pool.info)["processes"])


# -- deaths ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_killed_child_fails_its_job_with_worker_lost_and_is_replaced(
        driver: str, release: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="worker.pool")
    with run_pool(PoolOptions(concurrency=2), driver) as runner:
        probe = runner.submit(jobs.wait_for_path, (release,)).wait_accepted()
        victim = probe.pid
        os.kill(victim, signal.SIGKILL)
        error = probe.wait().error
        assert isinstance(error, WorkerLostError)
        assert re.fullmatch(r"Worker exited prematurely: signal 9 \(SIGKILL\) Job: \d+\.", str(error))
        assert re.search(rf"Process 'ForkPoolWorker-\d+' pid:{victim} exited with 'signal 9 \(SIGKILL\)'",
                         caplog.text)
        wait_for(lambda: len(processes(runner)) == 2 and victim not in processes(runner),
                 message="the killed child to be replaced")
        assert runner.submit(jobs.add, (1, 2)).wait().result == 3
        runner.stop()


def test_jobs_queued_behind_a_killed_child_run_elsewhere(release: str) -> None:
    with run_pool(PoolOptions(concurrency=2, scheduling="fcfs"), "thread") as runner:
        long = runner.submit(jobs.wait_for_path, (release,)).wait_accepted()
        quick = runner.submit(jobs.add, (1, 1)).wait()
        queued = runner.submit(jobs.add, (2, 2))  # round-robin: written behind the long job
        time.sleep(0.1)  # a negative: a while in which the queued job would run, were it not stuck
        assert not queued.done.is_set()
        os.kill(long.pid, signal.SIGKILL)
        assert isinstance(long.wait().error, WorkerLostError)
        assert queued.wait().result == 4
        assert queued.pid != long.pid
        assert quick.result == 2
        runner.stop()


@pytest.mark.parametrize("driver", DRIVERS)
def test_terminate_job_kills_the_task_and_the_child_is_replaced(driver: str, release: str) -> None:
    with run_pool(PoolOptions(concurrency=1), driver) as runner:
        probe = runner.submit(jobs.wait_for_path, (release,)).wait_accepted()
        runner.call(runner.pool.terminate_job, probe.pid)
        assert "signal 15 (SIGTERM)" in str(probe.wait().error)
        with pytest.raises(PoolError, match="no child process with pid 1 "):
            runner.call(runner.pool.terminate_job, 1)
        assert runner.submit(jobs.add, (2, 2)).wait().result == 4
        runner.stop()


@pytest.mark.parametrize("driver", DRIVERS)
def test_terminate_job_kills_a_child_that_outlives_its_sigterm(driver: str, tmp_path: Path) -> None:
    ready = tmp_path / "ignoring"
    with run_pool(PoolOptions(concurrency=1), driver) as runner:
        probe = runner.submit(ignore_sigterm_then_sleep, (str(ready), 30.0)).wait_accepted()
        wait_for(ready.exists, message="the task to ignore SIGTERM")
        started = time.monotonic()
        runner.call(runner.pool.terminate_job, probe.pid)
        error = probe.wait().error
        assert isinstance(error, WorkerLostError) and "signal 9 (SIGKILL)" in str(error)
        assert time.monotonic() - started < 10
        assert runner.submit(jobs.add, (2, 2)).wait().result == 4
        runner.stop()


def test_sigint_to_a_child_does_not_interrupt_its_task() -> None:
    """Ctrl-C reaches every process of the terminal's group; the parent decides, not the child."""
    with run_pool(PoolOptions(concurrency=1), "thread") as runner:
        probe = runner.submit(jobs.sleep, (0.3,)).wait_accepted()
        os.kill(probe.pid, signal.SIGINT)
        assert probe.wait().result == 0.3
        runner.stop()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_sigterm_the_parent_did_not_send_leaves_the_task_running(driver: str) -> None:
    """systemd's default KillMode signals every process of the service; the parent decides."""
    with run_pool(PoolOptions(concurrency=1), driver) as runner:
        probe = runner.submit(jobs.sleep, (0.5,)).wait_accepted()
        os.kill(probe.pid, signal.SIGTERM)
        assert probe.wait().result == 0.5
        assert runner.submit(jobs.whoami).wait().result[0] == probe.pid  # the same child, still serving
        runner.stop()


def test_children_die_with_their_parent() -> None:
    script = textwrap.dedent("""
        import sys, time
        from worker_core.slots import PoolOptions
        from worker_pool_prefork import PreforkPool
        pool = PreforkPool(PoolOptions(concurrency=2))
        pool.start()
        print(" ".join(str(pid) for pid in pool.info()["processes"]), flush=True)
        time.sleep(60)  # the parent lives on until the test kills it
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        assert parent.stdout is not None
        children = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(children) == 2
        parent.kill()
        parent.wait(10)

        def gone(pid: int) -> bool:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                return True
            return state == "Z"  # dead, waiting for init to reap it

        wait_for(lambda: all(gone(pid) for pid in children), 5.0,
                 message=f"children {children} to exit with their parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- time limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_soft_time_limit_raises_inside_the_task_which_can_catch_it(driver: str) -> None:
    with run_pool(PoolOptions(concurrency=1), driver) as runner:
        probe = runner.submit(jobs.catch_soft_limit, (5.0,), soft_timeout=0.2).wait()
        assert probe.result == "soft limit caught"
        assert probe.timeouts() == [(True, 0.2)]
        assert runner.submit(jobs.add, (1, 1)).wait().pid == probe.pid  # the child lives on
        runner.stop()


@pytest.mark.parametrize("driver", DRIVERS)
def test_hard_time_limit_kills_and_replaces_the_child(driver: str) -> None:
    with run_pool(PoolOptions(concurrency=1, soft_time_limit=0.1, time_limit=0.4), driver) as runner:
        began = time.monotonic()
        probe = runner.submit(jobs.busy_sleep, (10.0,)).wait()
        assert time.monotonic() - began < 3.0
        assert isinstance(probe.error, TimeLimitExceeded)
        assert probe.timeouts() == [(True, 0.1), (False, 0.4)]
        victim = probe.pid
        wait_for(lambda: victim not in child_pids(), message="the timed-out child to be killed")
        after = runner.submit(jobs.sleep, (0.05,), timeout=5.0).wait()  # per-job limit overrides the pool's
        assert after.result == 0.05 and after.pid != victim
        runner.stop()


# -- recycling ------------------------------------------------------------------------------------


def test_child_is_replaced_after_max_tasks_per_child() -> None:
    with run_pool(PoolOptions(concurrency=1, max_tasks_per_child=2), "thread") as runner:
        probes = [runner.submit(jobs.whoami) for _ in range(6)]
        pids = [probe.wait().result[0] for probe in probes]
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5]
        assert len(set(pids)) == 3
        runner.stop()


@pytest.mark.parametrize("scheduling", ["fair", "fcfs"])
def test_child_is_replaced_when_its_resident_memory_passes_the_limit(scheduling: str) -> None:
    limit = resident_kib() + 64 * 1024
    options = PoolOptions(concurrency=1, max_memory_per_child=limit, scheduling=scheduling)
    with run_pool(options, "thread") as runner:
        small = runner.submit(jobs.whoami).wait().result[0]
        assert runner.submit(jobs.whoami).wait().result[0] == small  # under the limit: kept
        big = runner.submit(jobs.allocate, (128,))
        # Under fcfs these are written behind the big job and must be re-sent to the replacement.
        after = [runner.submit(jobs.whoami) for _ in range(3)]
        assert big.wait().result == small
        pids = {probe.wait().result[0] for probe in after}
        assert small not in pids and len(pids) == 1
        runner.stop()


# -- scheduling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_fair_scheduling_runs_short_jobs_while_a_long_one_runs(driver: str, release: str) -> None:
    with run_pool(PoolOptions(concurrency=2, scheduling="fair"), driver) as runner:
        long = runner.submit(jobs.wait_for_path, (release,)).wait_accepted()
        short = [runner.submit(jobs.add, (index, 1)) for index in range(6)]
        for probe in short:
            probe.wait(5.0)
            assert probe.pid != long.pid
        assert not long.done.is_set()
        Path(release).touch()
        assert long.wait().result == "released"
        runner.stop()


@pytest.mark.parametrize("driver", DRIVERS)
def test_fair_scheduling_gives_each_job_to_the_child_idle_since_last(driver: str) -> None:
    # One job at a time on an idle pool: the child that just finished takes the next, warm,
    # rather than the one that has waited longest.
    with run_pool(PoolOptions(concurrency=3, scheduling="fair"), driver) as runner:
        warm = [runner.submit(jobs.sleep, (0.3,)) for _ in range(3)]
        assert len({probe.wait().pid for probe in warm}) == 3  # every child is up and idle
        pids = [runner.submit(jobs.whoami).wait().result[0] for _ in range(5)]
        assert len(set(pids)) == 1, pids
        runner.stop()


@pytest.mark.parametrize("driver", DRIVERS)
def test_fair_scheduling_hands_jobs_queued_behind_a_long_one_to_the_child_that_is_free(
        driver: str, release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every child busy, jobs are written behind running ones; once the job they wait for
    has run for QUEUE_GRACE and another child is free, that child takes them over."""
    # A job that has run for QUEUE_GRACE (5 ms) gets nothing written behind it: the jobs then wait
    # in the parent, and there is nothing to take over. A longer grace lets this test write its
    # jobs behind the long one however slowly it submits them.
    monkeypatch.setattr(engine, "QUEUE_GRACE", 1.0)
    with run_pool(PoolOptions(concurrency=2, scheduling="fair"), driver) as runner:
        long = runner.submit(jobs.wait_for_path, (release,))
        medium = runner.submit(jobs.sleep, (0.3,))
        short = [runner.submit(jobs.add, (index, 1)) for index in range(6)]
        for probe in short:
            probe.wait(5.0)
        assert not long.done.is_set()
        assert {probe.pid for probe in short} == {medium.wait().pid} != {long.pid}
        assert runner.call(runner.pool.info)["taken-over"] >= 1
        Path(release).touch()
        assert long.wait().result == "released"
        runner.stop()


@pytest.mark.parametrize("driver", DRIVERS)
def test_every_job_runs_exactly_once_while_free_children_take_over_queued_ones(
        driver: str, tmp_path: Path) -> None:
    record = str(tmp_path / "runs")
    durations = [0.0, 0.0, 0.001, 0.004, 0.008, 0.02]
    with run_pool(PoolOptions(concurrency=3, scheduling="fair"), driver) as runner:
        probes = [runner.submit(jobs.append_line, (record, str(n), durations[n * 7 % len(durations)]))
                  for n in range(300)]
        assert sorted(int(probe.wait(30.0).result) for probe in probes) == list(range(300))
        assert runner.call(runner.pool.info)["taken-over"] > 0
        runner.stop()
    runs = Path(record).read_text().split()
    assert sorted(map(int, runs)) == list(range(300))  # each ran once: none twice, none lost


def test_fcfs_scheduling_queues_jobs_behind_a_busy_child(release: str) -> None:
    """fcfs writes jobs round-robin to every child, busy or not: the ones written to the child
    running the long job wait for it, unlike under fair scheduling."""
    with run_pool(PoolOptions(concurrency=2, scheduling="fcfs"), "thread") as runner:
        long = runner.submit(jobs.wait_for_path, (release,)).wait_accepted()
        short = [runner.submit(jobs.add, (index, 1)) for index in range(6)]
        wait_for(lambda: sum(probe.done.is_set() for probe in short) >= 3,
                 message="the idle child to run jobs")
        time.sleep(0.2)  # time enough for the idle child to take more, were any written to it
        waiting = [probe for probe in short if not probe.done.is_set()]
        assert len(waiting) == 3  # every other job went to the busy child
        Path(release).touch()
        for probe in short:
            probe.wait()
        assert {probe.pid for probe in waiting} == {long.pid}
        runner.stop()


@pytest.mark.parametrize(("scheduler", "policy"), [(None, "SCHED_BATCH"), ("normal", "SCHED_OTHER"),
                                                   ("batch", "SCHED_BATCH")])
def test_children_run_under_the_cpu_policy_asked_for(scheduler: str | None, policy: str) -> None:
    extra = {} if scheduler is None else {"child_scheduler": scheduler}
    with run_pool(PoolOptions(concurrency=2, extra=extra), "thread") as runner:
        assert {os.sched_getscheduler(pid) for pid in processes(runner)} == {getattr(os, policy)}
        assert runner.submit(jobs.add, (1, 2)).wait().result == 3
        runner.stop()


def test_an_unknown_cpu_policy_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"child_scheduler must be one of batch, normal.*'fifo'"):
        PreforkPool.check_options(PoolOptions(concurrency=1, extra={"child_scheduler": "fifo"}))


# -- size -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_grow_and_shrink_under_load(driver: str, release: str) -> None:
    with run_pool(PoolOptions(concurrency=2), driver) as runner:
        pool = runner.pool
        held = [runner.submit(jobs.wait_for_path, (release,)) for _ in range(2)]
        for probe in held:
            probe.wait_accepted()
        with pytest.raises(PoolError, match="all 2 processes are busy"):
            runner.call(pool.shrink, 1)
        runner.call(pool.grow, 2)
        assert runner.call(lambda: pool.num_processes) == 4
        extra = [runner.submit(jobs.add, (index, 1)) for index in range(4)]
        for probe in extra:
            probe.wait()
        assert {probe.pid for probe in extra}.isdisjoint({probe.pid for probe in held})
        runner.call(pool.shrink, 2)
        assert runner.call(lambda: pool.num_processes) == 2
        wait_for(lambda: len(processes(runner)) == 2, message="the shrunk children to exit")
        assert sorted(processes(runner)) == sorted(probe.pid for probe in held)
        Path(release).touch()
        for probe in held:
            assert probe.wait().result == "released"
        runner.stop()


# -- start and stop -------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_stop_leaves_no_child_processes(driver: str) -> None:
    with run_pool(PoolOptions(concurrency=3), driver) as runner:
        pids = set(processes(runner))
        probes = [runner.submit(jobs.sleep, (0.05,)) for _ in range(6)]
        assert pids <= child_pids()
        runner.stop()
        assert all(probe.done.is_set() for probe in probes)
        assert not pids & child_pids()  # exited and reaped: no zombies either
    assert not [t for t in threading.enumerate() if t.name == "worker-prefork-pool"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_terminate_leaves_no_child_processes(driver: str, release: str) -> None:
    with run_pool(PoolOptions(concurrency=2), driver, kill_grace=0.2) as runner:
        pids = set(processes(runner))
        running = runner.submit(jobs.wait_for_path, (release,)).wait_accepted()
        queued = [runner.submit(jobs.wait_for_path, (release,)) for _ in range(3)]
        runner.terminate()
        assert isinstance(running.wait().error, WorkerLostError)
        for probe in queued:
            assert isinstance(probe.wait().error, WorkerLostError)
        assert not pids & child_pids()


def test_the_hub_driver_runs_no_thread() -> None:
    with run_pool(PoolOptions(concurrency=2), "hub") as runner:
        assert runner.submit(jobs.add, (1, 1)).wait().result == 2
        assert not [t for t in threading.enumerate() if t.name == "worker-prefork-pool"]
        assert runner.call(runner.pool.info)["driver"] == "hub"
        runner.stop()


def test_a_child_forked_by_the_pool_thread_survives_the_switch_to_the_hub() -> None:
    """On Linux a child gets SIGKILL when the *thread* that forked it ends; the pool's thread
    must linger after handing over to the hub until the children it forked are gone."""
    from kombu.asynchronous import Hub

    pool = PreforkPool(PoolOptions(concurrency=1))
    hub: Any = Hub()  # type: ignore[no-untyped-call]
    try:
        pool.start()
        first = pool.info()["processes"][0]
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: pool.info()["processes"] not in ([], [first]),
                 message="the killed child to be replaced")
        replacement = pool.info()["processes"][0]
        pool.register_with_event_loop(hub)
        time.sleep(0.2)  # a negative: time for the child to die with the pool's thread, were it to
        assert os.waitpid(replacement, os.WNOHANG) == (0, 0)  # alive, not SIGKILLed
        done: list[object] = []
        pool.apply_async(jobs.add, (2, 2), callback=done.append)

        def answered() -> list[object]:
            hub.run_once()
            return done

        wait_for(answered, interval=0, message="the job's result through the hub")
        assert done == [4]
    finally:
        pool.terminate()
        hub.close()
    assert replacement not in child_pids()


def test_failing_initializer_reports_a_bad_start_without_a_fork_storm(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="worker.pool")
    runner = run_pool(PoolOptions(concurrency=2, initializer=failing_initializer), "thread")
    with runner:
        pool = runner.pool
        assert isinstance(pool, PreforkPool)
        assert pool.did_start_ok() is False
        time.sleep(1.5)  # the behaviour under test: how many forks 1.5 s of failing starts make
        assert pool.forks <= 8, f"{pool.forks} forks in 1.5s: restarts are not backing off"
        assert "database unreachable (test)" in caplog.text
        assert "next fork in" in caplog.text
        began = time.monotonic()
        runner.stop()
        assert time.monotonic() - began < 5.0
        assert not child_pids() & set(processes(runner))


def test_warm_stop_fails_queued_jobs_when_children_never_start() -> None:
    with run_pool(PoolOptions(concurrency=1, initializer=failing_initializer), "thread") as runner:
        queued = runner.submit(jobs.add, (1, 1))
        began = time.monotonic()
        runner.stop()
        assert time.monotonic() - began < 5.0
        assert "never started" in str(queued.wait().error)
        assert isinstance(runner.pool, PreforkPool) and runner.pool.forks <= 6


def test_start_gives_up_waiting_for_a_stuck_initializer() -> None:
    def stuck() -> None:
        time.sleep(30)  # the initializer under test: stuck

    with run_pool(PoolOptions(concurrency=1, initializer=stuck), "thread", start_timeout=0.3) as runner:
        assert runner.pool.did_start_ok() is False
        runner.terminate()


# -- payloads and names ---------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_large_arguments_and_results_cross_the_pipes(driver: str) -> None:
    payload = os.urandom(3 * 1024 * 1024)
    with run_pool(PoolOptions(concurrency=2), driver) as runner:
        probes = [runner.submit(jobs.echo, (payload,)) for _ in range(3)]
        assert all(probe.wait().result == payload for probe in probes)
        runner.stop()


def test_unpicklable_job_fails_through_the_error_callback() -> None:
    with run_pool(PoolOptions(concurrency=1), "thread") as runner:
        probe = runner.submit(lambda: None)
        assert probe.done.is_set()  # reported before apply_async returned
        assert isinstance(probe.error, PoolError)
        assert "module-level function" in str(probe.error)
        runner.stop()


def test_children_are_named_fork_pool_worker() -> None:
    with run_pool(PoolOptions(concurrency=2), "thread") as runner:
        assert re.fullmatch(r"ForkPoolWorker-\d+", runner.submit(process_name).wait().result)
        runner.stop()


def test_info_reports_celery_stats_keys() -> None:
    options = PoolOptions(concurrency=2, max_tasks_per_child=5, soft_time_limit=3, time_limit=4)
    with run_pool(options, "thread") as runner:
        runner.submit(jobs.add, (1, 1)).wait()
        info = runner.call(runner.pool.info)
        assert info["implementation"] == "worker_pool_prefork.pool:PreforkPool"
        assert info["max-concurrency"] == 2 and len(info["processes"]) == 2
        assert info["max-tasks-per-child"] == 5 and info["timeouts"] == [3, 4]
        assert info["writes"]["total"] == 1 and info["writes"]["strategy"] == "fair"
        runner.stop()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("concurrency", -1, "concurrency must be an integer >= 0 (got -1"),
    ("scheduling", "random", "scheduling must be 'fair' or 'fcfs' (got 'random')"),
    ("time_limit", -5, "time_limit must be a number of seconds >= 0 or None (got -5"),
    ("max_tasks_per_child", 0, "max_tasks_per_child must be a positive integer or None (got 0"),
])
def test_check_options_refuses_bad_values(field: str, value: object, message: str) -> None:
    options = PoolOptions(concurrency=2, **{field: value}) if field != "concurrency" else PoolOptions(value)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        PreforkPool.check_options(options)

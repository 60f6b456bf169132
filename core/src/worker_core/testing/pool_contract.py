"""The pool contract suite: checks any :class:`~worker_core.slots.Pool` implementation against
the protocol, driven directly (sync loop) or on a kombu hub (async loop).

A third-party pool runs it in one line::

    from worker_core.testing import pool_contract

    pool_contract.run_all(MyPool)              # driven directly, as under the sync loop
    pool_contract.run_all(MyPool, hub=True)    # driven by a kombu hub, as under the async loop

or, to see each check as its own pytest test::

    import pytest
    from worker_core.testing import pool_contract

    @pytest.mark.parametrize("check", pool_contract.CHECKS, ids=pool_contract.check_name)
    @pytest.mark.parametrize("hub", [False, True], ids=["direct", "hub"])
    def test_my_pool_honours_the_pool_contract(check, hub):
        check(MyPool, hub=hub)

Each check takes a pool factory (usually the pool class, called as ``factory(PoolOptions)``)
and raises ``AssertionError`` saying what the pool did wrong. Job targets come from
:mod:`worker_core.testing.jobs`, so process pools can import them in their children. Pools that
run jobs inline (solo) are detected and skip what needs concurrency; pools that cannot grow must
raise ``PoolError`` from both ``grow`` and ``shrink``.

One module, as every shipped suite: a third party imports one name and runs it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from ..exceptions import JobWithdrawn, PoolError, WorkerLostError
from ..plugins.conformance import capability_problems, conformance_problem
from ..slots import Pool, PoolFactory, PoolOptions, WithdrawsOneJob, WithdrawsQueuedJobs
from . import jobs
from .runner import JobProbe, PoolRunner

__all__ = ["CHECKS", "OPTIONS", "Check", "check_name", "run_all"]

#: The options every check starts its pool with (plus an initializer where it checks it).
OPTIONS = PoolOptions(concurrency=2)

#: Keys of ``info()`` every pool reports (Celery's ``inspect stats`` names).
INFO_KEYS = ("implementation", "max-concurrency", "processes", "max-tasks-per-child", "timeouts")


class Check(Protocol):
    __name__: str

    def __call__(self, factory: PoolFactory, *, hub: bool = False) -> None: ...


def _expect(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _label(factory: PoolFactory) -> str:
    return getattr(factory, "__qualname__", repr(factory))


def _is_inline(runner: PoolRunner) -> bool:
    probe = runner.submit(jobs.noop).wait()
    return probe.inline


def _release_path() -> str:
    return os.path.join(tempfile.mkdtemp(prefix="pool-contract-"), "release")


# -- the checks ---------------------------------------------------------------------------------


def check_the_pool_satisfies_the_pool_protocol(factory: PoolFactory, *, hub: bool = False) -> None:
    """The class has every member of :class:`~worker_core.slots.Pool` (what the plugin manager
    checks when it loads a pool) and offers no capability by halves; its instance is a ``Pool``."""
    if isinstance(factory, type):
        problem = conformance_problem("pool", factory)
        _expect(problem is None, f"{_label(factory)} {problem}")
    pool = factory(OPTIONS)
    _expect(isinstance(pool, Pool), f"{_label(factory)}(options) built {pool!r}, which is not a "
                                    f"worker_core.slots.Pool")
    problems = capability_problems(pool, "pool")
    _expect(not problems, f"{_label(factory)}(options) {'; '.join(problems)}")
    _expect(isinstance(type(pool).is_process_pool, bool),
            f"{_label(factory)}.is_process_pool must be a bool class attribute "
            f"(got {type(pool).is_process_pool!r})")
    pool.stop()


def check_options_accept_the_defaults(factory: PoolFactory, *, hub: bool = False) -> None:
    """``check_options`` accepts plain options, and construction does not start anything."""
    pool_class: object = factory
    if isinstance(pool_class, Pool):  # the class itself carries its class methods
        pool_class.check_options(OPTIONS)
    pool = factory(OPTIONS)
    _expect(pool.num_processes >= 0, f"{_label(factory)}.num_processes is negative before start()")
    pool.stop()


def check_start_reports_success(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        _expect(runner.call(runner.pool.did_start_ok) is True,
                f"{_label(factory)}.did_start_ok() is not True after a clean start()")
        _expect(runner.call(lambda: runner.pool.num_processes) >= 1,
                f"{_label(factory)}.num_processes is below 1 after start()")
        runner.stop()


def check_result_reaches_callback(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        probe = runner.submit(jobs.add, (2, 3)).wait()
        _expect(probe.result == 5, f"add(2, 3) reported {probe.result!r}, expected 5")
        runner.stop()
        _expect(len(probe.outcomes()) == 1, f"one job got several outcomes: {probe.events!r}")


def check_accept_comes_before_result_with_a_real_pid(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        probe = runner.submit(jobs.whoami).wait()
        kinds = probe.kinds()
        _expect(kinds == ["accept", "result"], f"expected accept then result, got {kinds}")
        pid = probe.pid
        reported_pid = probe.result[0]
        _expect(pid == reported_pid, f"accept_callback named pid {pid} but the job ran in pid {reported_pid}")
        if runner.pool.is_process_pool:
            _expect(pid != os.getpid(), "a process pool ran the job in the worker's own process")
        else:
            _expect(pid == os.getpid(), f"a pool without processes reported pid {pid}, not {os.getpid()}")
        os.kill(pid, 0)  # the process exists (raises if not)
        runner.stop()


def check_target_exception_reaches_error_callback(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        probe = runner.submit(jobs.fail, ("boom",)).wait()
        error = probe.error
        _expect(isinstance(error, ValueError) and "boom" in str(error),
                f"the target raised ValueError('boom'); error_callback got {error!r}")
        _expect(probe.kinds() == ["accept", "error"], f"expected accept then error, got {probe.kinds()}")
        after = runner.submit(jobs.add, (1, 1)).wait()
        _expect(after.result == 2, "the pool did not run jobs after a job raised")
        runner.stop()


def check_many_jobs_complete_exactly_once(factory: PoolFactory, *, hub: bool = False) -> None:
    count = 300
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        probes = [runner.submit(jobs.echo, (index,), label=f"job {index}") for index in range(count)]
        for probe in probes:
            probe.wait(30.0)
        runner.stop()
        for index, probe in enumerate(probes):
            _expect(probe.kinds() == ["accept", "result"] and probe.result == index,
                    f"job {index} of {count}: expected accept then result {index}, got {probe.events!r}")


def check_name_keyword_is_accepted(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        probe = runner.submit(jobs.add, (1, 2), name="contract.labelled", soft_timeout=None, timeout=None)
        _expect(probe.wait().result == 3, "a job submitted with name=... did not run")
        runner.stop()


def check_callback_may_submit_another_job(factory: PoolFactory, *, hub: bool = False) -> None:
    """A callback calling ``apply_async`` (as a retry would) must not deadlock the pool."""
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        second = JobProbe("second")

        def resubmit(value: Any) -> None:
            runner.pool.apply_async(jobs.add, (value, 1), **second.callbacks())

        first = JobProbe("first")
        runner.call(lambda: runner.pool.apply_async(jobs.add, (1, 1), callback=resubmit,
                                                    error_callback=first.on_error))
        _expect(second.wait().result == 3, f"the job submitted from a callback reported {second.events!r}")
        runner.stop()


def check_stop_waits_for_running_jobs(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        inline = _is_inline(runner)
        slow = runner.submit(jobs.sleep, (0.3,))
        queued = [runner.submit(jobs.add, (index, 0)) for index in range(4)]
        if not inline:
            slow.wait_accepted()
        runner.stop()
        for probe in (slow, *queued):
            _expect(probe.done.is_set() and probe.kinds()[-1] == "result",
                    f"stop() returned before {probe.label} finished: {probe.events!r}")
        try:
            runner.call(runner.pool.apply_async, jobs.noop)
        except PoolError:
            pass
        else:
            raise AssertionError("apply_async after stop() did not raise PoolError")
        runner.call(runner.pool.stop)  # a second stop is harmless
        runner.call(runner.pool.terminate)  # and so is terminate after stop


def check_terminate_fails_running_jobs(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        if _is_inline(runner):
            runner.terminate()
            return
        release = _release_path()
        try:
            stuck = runner.submit(jobs.wait_for_path, (release, 30.0)).wait_accepted()
            began = time.monotonic()
            runner.terminate()
            took = time.monotonic() - began
            _expect(took < 10.0, f"terminate() took {took:.1f}s with one running job")
            stuck.wait(5.0)
            _expect(isinstance(stuck.error, WorkerLostError),
                    f"a job running at terminate() should fail with WorkerLostError, got {stuck.events!r}")
        finally:
            Path(release).touch()


def check_grow_and_shrink(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        pool = runner.pool
        before = runner.call(lambda: pool.num_processes)
        try:
            runner.call(pool.grow, 1)
        except PoolError:
            _expect(runner.call(lambda: pool.num_processes) == before,
                    "a failed grow() changed num_processes")
            try:
                runner.call(pool.shrink, 1)
            except PoolError:
                pass
            else:
                raise AssertionError("a pool that cannot grow must refuse shrink() with PoolError too")
            runner.stop()
            return
        _expect(runner.call(lambda: pool.num_processes) == before + 1,
                f"grow(1) took num_processes from {before} to {runner.call(lambda: pool.num_processes)}")
        for probe in [runner.submit(jobs.add, (index, 1)) for index in range(6)]:
            _expect(probe.wait().result is not None, "a job failed after grow()")
        _wait_until(lambda: _idle_shrink(runner), "shrink(1) kept failing on an idle pool")
        _expect(runner.call(lambda: pool.num_processes) == before,
                f"shrink(1) after grow(1) left num_processes at {runner.call(lambda: pool.num_processes)}")
        _expect(runner.submit(jobs.add, (2, 2)).wait().result == 4, "a job failed after shrink()")
        runner.stop()


def _idle_shrink(runner: PoolRunner) -> bool:
    try:
        runner.call(runner.pool.shrink, 1)
    except PoolError:
        return False
    return True


def _wait_until(condition: Callable[[], bool], message: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.02)


@contextlib.contextmanager
def _every_executor_busy(runner: PoolRunner) -> Iterator[list[JobProbe]]:
    """One job per executor, each started before the block begins and running until it ends;
    their probes are yielded (they report ``"released"`` once the block is left)."""
    release = _release_path()
    try:
        size = runner.call(lambda: runner.pool.num_processes)
        blockers = [runner.submit(jobs.wait_for_path, (release, 30.0)) for _ in range(size)]
        for probe in blockers:
            probe.wait_accepted()
        yield blockers
    finally:
        Path(release).touch()


def check_shrink_refuses_when_every_executor_is_busy(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        pool = runner.pool
        if _is_inline(runner):
            try:
                runner.call(pool.shrink, 1)
            except PoolError:
                runner.stop()
                return
            raise AssertionError("an inline pool accepted shrink(1)")
        with _every_executor_busy(runner) as blockers:
            try:
                runner.call(pool.shrink, 1)
            except PoolError as exc:
                _expect("busy" in str(exc), f"the PoolError should say the executors are busy: {exc}")
            else:
                raise AssertionError(f"shrink(1) succeeded while all {len(blockers)} executors were busy")
        for probe in blockers:
            _expect(probe.wait().result == "released", f"a blocked job reported {probe.events!r}")
        runner.stop()


def check_withdraw_queued_gives_back_only_unstarted_jobs(factory: PoolFactory, *, hub: bool = False) -> None:
    """A pool that :class:`~worker_core.slots.WithdrawsQueuedJobs` (every ``SharesOneQueue`` pool
    does) gives back exactly the jobs no executor started, through ``error_callback`` with
    ``JobWithdrawn``."""
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        pool = runner.pool
        if not isinstance(pool, WithdrawsQueuedJobs) or _is_inline(runner):
            runner.stop()
            return
        withdraw = pool.withdraw_queued
        with _every_executor_busy(runner) as blockers:
            queued = [runner.submit(jobs.add, (n, n)) for n in range(3)]
            count = runner.call(withdraw)
            _expect(count == 3, f"withdraw_queued() returned {count} with 3 jobs queued behind busy "
                                "executors")
            for probe in queued:
                probe.wait()
                _expect(probe.kinds() == ["error"] and isinstance(probe.error, JobWithdrawn),
                        f"a withdrawn job reported {probe.events!r}, expected one JobWithdrawn error")
        for probe in blockers:
            _expect(probe.wait().result == "released", f"a running job reported {probe.events!r}")
        _expect(runner.call(withdraw) == 0, "withdraw_queued() gave back jobs when none was queued")
        _expect(runner.submit(jobs.add, (2, 2)).wait().result == 4, "a job failed after withdraw_queued()")
        runner.stop()


def check_withdraw_job_takes_back_only_a_job_not_started(factory: PoolFactory, *, hub: bool = False) -> None:
    """A pool that :class:`~worker_core.slots.WithdrawsOneJob` takes back a job queued behind busy
    executors, which then reports nothing at all, and refuses one that runs or has run."""
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        pool = runner.pool
        if not isinstance(pool, WithdrawsOneJob) or _is_inline(runner):
            runner.stop()
            return
        withdraw = pool.withdraw_job
        with _every_executor_busy(runner) as blockers:
            kept = runner.submit(jobs.add, (1, 1))
            taken = runner.submit(jobs.add, (2, 2))
            _expect(runner.call(withdraw, taken.handle) is True,
                    "withdraw_job() refused a job queued behind busy executors")
            _expect(runner.call(withdraw, blockers[0].handle) is False,
                    "withdraw_job() took back a running job")
        _expect(kept.wait().result == 2, f"the job left queued reported {kept.events!r}")
        _expect(runner.call(withdraw, kept.handle) is False, "withdraw_job() took back a finished job")
        runner.stop()
    _expect(taken.events == [], f"a job taken back reported {taken.events!r}, expected nothing")


def check_info_has_the_stats_keys(factory: PoolFactory, *, hub: bool = False) -> None:
    with PoolRunner(factory, OPTIONS, hub=hub) as runner:
        info = runner.call(runner.pool.info)
        missing = [key for key in INFO_KEYS if key not in info]
        _expect(not missing, f"info() lacks {missing}; it returned {dict(info)!r}")
        _expect(all(isinstance(pid, int) for pid in info["processes"]), "info()['processes'] must hold pids")
        _expect(len(info["timeouts"]) == 2, "info()['timeouts'] must be [soft, hard]")
        runner.stop()


def check_initializer_runs_once_in_every_executor(factory: PoolFactory, *, hub: bool = False) -> None:
    token = uuid.uuid4().hex
    options = PoolOptions(concurrency=2, initializer=functools.partial(jobs.mark_initialized, token))
    with PoolRunner(factory, options, hub=hub) as runner:
        inline = _is_inline(runner)
        release = _release_path()
        try:
            probes = []
            if not inline:
                # Hold every executor with a job, so each one reports from its own thread/process.
                size = runner.call(lambda: runner.pool.num_processes)
                probes = [runner.submit(jobs.whoami_after, (release, 30.0, token)) for _ in range(size)]
                for probe in probes:
                    probe.wait_accepted()
            Path(release).touch()
            probes.extend(runner.submit(jobs.whoami, (token,)) for _ in range(8))
            for probe in probes:
                probe.wait()
        finally:
            Path(release).touch()
        counts = sorted({probe.result[2] for probe in probes})
        _expect(counts == [1], f"the initializer should run exactly once in every executor before it takes "
                               f"jobs; jobs saw counts {counts} (0 = it did not run there)")
        if not inline:
            executors = {(probe.result[0], probe.result[1]) for probe in probes[:2]}
            _expect(len(executors) == 2, "two jobs held at once ran in the same executor")
        runner.stop()


#: Every check, in a sensible order.
CHECKS: tuple[Check, ...] = (
    check_the_pool_satisfies_the_pool_protocol,
    check_options_accept_the_defaults,
    check_start_reports_success,
    check_result_reaches_callback,
    check_accept_comes_before_result_with_a_real_pid,
    check_target_exception_reaches_error_callback,
    check_many_jobs_complete_exactly_once,
    check_name_keyword_is_accepted,
    check_callback_may_submit_another_job,
    check_stop_waits_for_running_jobs,
    check_terminate_fails_running_jobs,
    check_grow_and_shrink,
    check_shrink_refuses_when_every_executor_is_busy,
    check_withdraw_queued_gives_back_only_unstarted_jobs,
    check_withdraw_job_takes_back_only_a_job_not_started,
    check_info_has_the_stats_keys,
    check_initializer_runs_once_in_every_executor,
)


def check_name(check: Check) -> str:
    """A pytest id: the check's name without its ``check_`` prefix."""
    return check.__name__.removeprefix("check_")


def run_all(factory: PoolFactory, *, hub: bool = False, only: Iterable[str] | None = None) -> None:
    """Run every check (or those named in ``only``) against ``factory``; raise on the first failure."""
    wanted = set(only) if only is not None else None
    for check in CHECKS:
        if wanted is None or check_name(check) in wanted or check.__name__ in wanted:
            try:
                check(factory, hub=hub)
            except AssertionError as exc:
                raise AssertionError(f"{_label(factory)} fails {check.__name__} (hub={hub}): {exc}") from exc

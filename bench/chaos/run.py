"""One soak on one broker: publish, run the worker under random faults until every task has run,
let redeliveries settle, stop the worker warmly, and judge the ledger."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from .broker import Plan, open_broker
from .fleet import Fleet
from .injector import KINDS, Injector
from .ledger import Ledger
from .verdict import Verdict, judge

__all__ = ["Outcome", "SoakOptions", "soak"]

#: Log lines worth counting in the worker's logs (the expected consequences of the faults, and
#: the ones that would mean something went wrong).
LOG_MARKS = {
    "connection lost": "Connection to broker lost",
    "child lost, task sent again": "lost its process",
    "ack failed": "Could not acknowledge",
    "tracebacks": "Traceback",
    "critical": "CRITICAL",
    "leases lost (after a pause)": "Lost the leases",
    "copies dropped": "the copy is dropped",
    "wall clock jumps seen": "The wall clock jumped",
}


#: The worker's line for a task whose pool process died, sent again (``reject_on_worker_lost``).
LOST_PROCESS = re.compile(r"Task \S+\[(\S+)\] lost its process")


@attrs.frozen
class SoakOptions:
    tasks: int = 100_000
    pool: str = "prefork"
    concurrency: int = 2
    interval: tuple[float, float] = (0.5, 3.0)
    cut_length: tuple[float, float] = (0.2, 3.0)
    stall_timeout: float = 180.0
    seed: int | None = None
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672//"
    keep: bool = False
    loglevel: str = "WARNING"
    #: workers at once (each killed and restarted on its own)
    workers: int = 1
    faults: tuple[str, ...] = ("child-kill", "worker-kill", "connection-cut")
    #: seconds between the SIGTERM and the SIGKILL of a term-kill fault
    grace: float = 3.0
    #: Redis's visibility_timeout (seconds)
    visibility_timeout: float = 20.0
    #: share of the tasks that run ``long_seconds`` (default: twice the visibility timeout)
    long_share: float = 0.0
    long_seconds: float | None = None
    #: share of the tasks sent with a countdown longer than the visibility timeout (up to twice it)
    countdown_share: float = 0.0
    #: how long a pause lasts: MIN,MAX seconds (default: 1.5 to 3 visibility timeouts)
    pause_length: tuple[float, float] | None = None

    def plan(self, rng: random.Random) -> Plan:
        numbers = range(self.tasks)
        long = frozenset(rng.sample(numbers, round(self.tasks * self.long_share)))
        countdowns = {number: round(rng.uniform(1.2, 2.0) * self.visibility_timeout, 1)
                      for number in rng.sample(numbers, round(self.tasks * self.countdown_share))}
        seconds = self.long_seconds if self.long_seconds is not None else 2 * self.visibility_timeout
        return Plan(long, seconds, countdowns)


@attrs.frozen
class Outcome:
    broker: str
    verdict: Verdict
    faults: dict[str, int]
    crashes: list[tuple[int, int]]
    stalled: bool
    final_exit: int | None
    left_in_broker: int
    #: the task ids of the messages left in the broker
    leftovers: tuple[str, ...]
    plan: Plan
    workers: int
    visibility_timeout: float | None
    publish_seconds: float
    run_seconds: float
    settle_seconds: float
    log_counts: dict[str, int]
    workdir: Path
    seed: int
    #: term-kill faults whose worker was still running at the SIGKILL
    term_killed: int = 0

    @property
    def clean(self) -> bool:
        """Nothing lost, every extra run explained, no crash, a clean warm shutdown."""
        verdict = self.verdict
        return (not verdict.lost and not verdict.unexplained and not self.crashes and not self.stalled
                and self.final_exit == 0 and self.left_in_broker == 0
                and self.log_counts["tracebacks"] == 0 and self.log_counts["critical"] == 0)


def _worker_args(options: SoakOptions, broker_url: str, queue: str) -> list[str]:
    return ["-A", "soak_app", "-P", options.pool, "-c", str(options.concurrency), "-Q", queue,
            "-b", broker_url, "-l", options.loglevel]


def _wait_for_all(ledger: Ledger, fleet: Fleet, injector: Injector, tasks: int, stall_timeout: float) -> bool:
    """Inject faults until every task has run; False if progress stopped for ``stall_timeout``."""
    injector.schedule()
    last_progress = time.monotonic()
    while ledger.distinct < tasks:
        time.sleep(0.1)
        if ledger.poll():
            last_progress = time.monotonic()
        fleet.check()
        if injector.due():
            injector.inject()
        if time.monotonic() - last_progress > stall_timeout:
            return False
    return True


def _settle(ledger: Ledger, fleet: Fleet, waiting: Callable[[], int], quiet: float, limit: float) -> None:
    """Without faults, wait until nothing is left in the broker and no run arrived for ``quiet`` s."""
    deadline = time.monotonic() + limit
    last_change = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        fleet.check()
        if ledger.poll():
            last_change = time.monotonic()
        if time.monotonic() - last_change >= quiet and waiting() == 0:
            return


def _save(workdir: Path, ledger: Ledger, injector: Injector) -> None:
    """Keep the executions and the faults next to the worker logs, one per line, to look into."""
    with (workdir / "executions.txt").open("w") as out:
        for execution in sorted(ledger.executions, key=lambda e: e.at):
            out.write(f"{execution.at:.6f} {execution.task_id} pid={execution.pid} "
                      f"gen={execution.generation} redelivered={int(execution.redelivered)}\n")
    with (workdir / "faults.txt").open("w") as out:
        for event in injector.events:
            out.write(f"{event.started:.6f}-{event.ended:.6f} {event.kind} "
                      f"gen={event.generation} pid={event.pid} killed={int(event.killed)}\n")


def soak(kind: str, options: SoakOptions) -> Outcome:
    seed = options.seed if options.seed is not None else random.randrange(2**32)
    workdir = Path(tempfile.mkdtemp(prefix=f"soak-{kind}-"))
    broker = open_broker(kind, workdir, options.amqp_url, options.visibility_timeout)
    plan = options.plan(random.Random(seed))
    ledger = Ledger(broker.ledger_url)
    fleet: Fleet | None = None
    clean = False
    try:
        ledger.clear()
        started = time.monotonic()
        broker.publish(options.tasks, plan)
        published = time.monotonic()
        env = dict(os.environ, SOAK_LEDGER_URL=broker.ledger_url,
                   WORKER_BROKER_TRANSPORT_OPTIONS=json.dumps(broker.transport_options))
        env.pop("WORKER_BROKER_URL", None)
        fleet = Fleet(_worker_args(options, broker.proxied_url, broker.queue), env, workdir,
                      name=f"{broker.queue}-{{slot}}@localhost", size=options.workers,
                      clocks="clock-step" in options.faults)
        fleet.start()
        pause = options.pause_length or (1.5 * options.visibility_timeout, 3.0 * options.visibility_timeout)
        injector = Injector(fleet, broker.proxy, random.Random(seed), options.interval, options.cut_length,
                            kinds=options.faults, grace=options.grace, pause_length=pause)
        completed = _wait_for_all(ledger, fleet, injector, options.tasks, options.stall_timeout)
        ran = time.monotonic()
        quiet_limit = float(broker.transport_options.get("visibility_timeout", 0)) * 2 + 60
        quiet_limit += plan.long_seconds if plan.long else 0
        # RabbitMQ counts only the ready messages: one a worker holds behind a long task shows
        # only once it runs, so the quiet wait covers a long task.
        quiet = 3.0 + (plan.long_seconds if plan.long else 0.0)
        _settle(ledger, fleet, broker.waiting, quiet=quiet, limit=quiet_limit)
        settled = time.monotonic()
        final_exit = fleet.stop()
        ledger.poll()
        left = broker.waiting()
        leftovers = broker.leftovers() if left else []
        logs = fleet.logs()
        _save(workdir, ledger, injector)
        outcome = Outcome(
            broker=kind,
            verdict=judge(options.tasks, ledger.by_task(), injector.events, set(LOST_PROCESS.findall(logs)),
                          queued_in_children=options.pool != "threads" and options.pool != "solo",
                          leases=kind == "redis"),
            faults={kind_: injector.count(kind_) for kind_ in KINDS},
            crashes=list(fleet.crashes),
            stalled=not completed,
            final_exit=final_exit,
            left_in_broker=left,
            leftovers=tuple(leftovers),
            plan=plan,
            workers=options.workers,
            visibility_timeout=broker.transport_options.get("visibility_timeout"),
            publish_seconds=published - started,
            run_seconds=ran - published,
            settle_seconds=settled - ran,
            log_counts={name: logs.count(mark) for name, mark in LOG_MARKS.items()},
            workdir=workdir,
            seed=seed,
            term_killed=sum(1 for event in injector.events if event.kind == "term-kill" and event.killed),
        )
        clean = outcome.clean
        return outcome
    finally:
        if fleet is not None:
            fleet.kill()
        ledger.close()
        broker.close()
        if clean and not options.keep:  # keep the logs of a run that went wrong
            shutil.rmtree(workdir, ignore_errors=True)

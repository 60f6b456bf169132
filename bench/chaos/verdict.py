"""What a soak proved: tasks lost, and every extra run matched to the fault that caused it.

An extra run of a task is explained by the fault between its previous run and itself:

- ``child-kill``: the worker logged that the task lost its pool process (the soak SIGKILLed the
  child after the task recorded its run, before the result reached the worker) and sent it
  again (``reject_on_worker_lost``);
- ``worker-kill``: the previous run was in a worker the soak then killed (before the last of its
  processes was SIGKILLed), and this one started after the kill began: the broker delivered the
  unacknowledged message again;
- ``term-kill``: the same, for a worker SIGKILLed a few seconds after its SIGTERM, while the
  previous run was still running (a worker that had finished by then explains nothing);
- ``cut: ack lost``: the broker marked the message redelivered, and the connection was cut
  after the previous run: its acknowledgement was lost with the connection;
- ``cut: stale prefetch``: redelivered, and the previous run came *after* the connection was
  back: a worker still ran a message it had prefetched on the lost connection (whose
  acknowledgement cannot reach the broker), while the broker delivered it again.

- ``pause: running``: the previous run was in a worker the soak then stopped (SIGSTOP, past
  Redis's visibility timeout), and this one is another worker's, after the pause began: a task
  running when its worker stood still runs where the broker gave its copy too (the documented
  limit; the paused worker starts nothing else it lost);
- ``pause: queued in a child``: the previous run was another worker's, after the pause began, and
  this one the paused worker's, as it resumed: a job its prefork pool had written to a child
  before the pause starts there before the worker can check its leases (the documented limit of
  process pools).

The first three are a process running the task dying; the cuts and pauses kill no process
(RabbitMQ cannot take an acknowledgement for a delivery of a connection that is gone). A clock
step explains nothing: a worker whose clock is off takes no lease and loses none. Anything else is
``unexplained`` and listed.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence

import attrs

from .injector import FaultEvent
from .ledger import Execution

__all__ = ["CAUSES", "DEATHS", "Verdict", "judge"]

CAUSES = ("child-kill", "worker-kill", "term-kill", "cut: ack lost", "cut: stale prefetch", "pause: running",
          "pause: queued in a child", "unexplained")
#: The causes in which a process running the task died.
DEATHS = ("child-kill", "worker-kill", "term-kill")
#: How long before a cut a message may have been prefetched and still be run after it.
PREFETCH_WINDOW = 30.0
#: How long after a pause a job queued in a child before it may start there (behind a long task).
RESUME_WINDOW = 60.0


@attrs.frozen
class Verdict:
    tasks: int
    ran: int
    lost: tuple[str, ...]
    executions: int
    duplicates: collections.Counter[str]
    unexplained: tuple[tuple[Execution, Execution], ...]

    @property
    def extra_runs(self) -> int:
        return sum(self.duplicates.values())

    @property
    def extra_runs_without_a_death(self) -> int:
        """Extra runs no process death explains (connection cuts, and the unexplained)."""
        return sum(count for cause, count in self.duplicates.items() if cause not in DEATHS)


def _cause(previous: Execution, current: Execution, events: Sequence[FaultEvent],
           lost_process: set[str], queued_in_children: bool = True, leases: bool = True) -> str:
    same_generation = previous.generation == current.generation
    # sent again by its worker; another worker (or the next generation, after a warm shutdown
    # gave it back) may run it
    if current.task_id in lost_process and any(
        event.kind == "child-kill" and event.pid == previous.pid
        and previous.at <= event.started <= current.at for event in events
    ):
        return "child-kill"
    if not same_generation:
        for event in events:
            if event.generation != previous.generation or not event.killed:
                continue
            if event.kind == "worker-kill" and previous.at <= event.ended and event.started <= current.at:
                return "worker-kill"
            if event.kind == "term-kill" and previous.at <= event.ended <= current.at:
                return "term-kill"
    for event in events:
        if not leases or event.kind != "pause" or previous.generation == current.generation:
            continue
        if previous.generation == event.generation and previous.at <= event.started <= current.at:
            return "pause: running"
        if (queued_in_children and current.generation == event.generation and previous.at >= event.started
                and event.ended <= current.at <= event.ended + RESUME_WINDOW):
            return "pause: queued in a child"
    if current.redelivered:
        cuts = [event for event in events if event.kind == "connection-cut" and event.started <= current.at]
        if any(event.ended >= previous.at for event in cuts):
            return "cut: ack lost"
        if any(previous.at - PREFETCH_WINDOW <= event.ended < previous.at for event in cuts):
            return "cut: stale prefetch"
    return "unexplained"


def judge(tasks: int, by_task: dict[str, list[Execution]], events: Sequence[FaultEvent],
          lost_process: set[str], queued_in_children: bool = True, leases: bool = True) -> Verdict:
    """:param lost_process: ids of the tasks the worker logged as having lost their process.
    :param queued_in_children: whether the pool writes jobs to its processes ahead (prefork).
    :param leases: whether the broker lends messages for a time (Redis): elsewhere a pause
        explains nothing (RabbitMQ keeps a stopped consumer's messages, unless its connection is
        closed for missed heartbeats, which the worker logs as a lost connection)."""
    expected = [f"t{number}" for number in range(tasks)]
    lost = tuple(task_id for task_id in expected if task_id not in by_task)
    duplicates: collections.Counter[str] = collections.Counter({cause: 0 for cause in CAUSES})
    unexplained: list[tuple[Execution, Execution]] = []
    for runs in by_task.values():
        ordered = sorted(runs, key=lambda execution: execution.at)
        for previous, current in itertools.pairwise(ordered):
            cause = _cause(previous, current, events, lost_process, queued_in_children, leases)
            duplicates[cause] += 1
            if cause == "unexplained":
                unexplained.append((previous, current))
    return Verdict(
        tasks=tasks,
        ran=sum(1 for task_id in expected if task_id in by_task),
        lost=lost,
        executions=sum(len(runs) for runs in by_task.values()),
        duplicates=duplicates,
        unexplained=tuple(unexplained),
    )

"""The soak's summary table: one column per broker."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

from .run import Outcome
from .verdict import CAUSES

__all__ = ["details", "table"]

Row = tuple[str, Callable[[Outcome], Any]]

ROWS: list[Row] = [
    ("workers", lambda o: o.workers),
    ("visibility timeout (s)", lambda o: "-" if o.visibility_timeout is None else o.visibility_timeout),
    ("tasks", lambda o: o.verdict.tasks),
    ("  long (running s)", lambda o: f"{len(o.plan.long)} ({o.plan.long_seconds:g})" if o.plan.long else 0),
    ("  with a countdown > visibility", lambda o: len(o.plan.countdowns)),
    ("ran at least once", lambda o: o.verdict.ran),
    ("lost (never ran)", lambda o: len(o.verdict.lost)),
    ("executions", lambda o: o.verdict.executions),
    ("duplicate runs (extra executions)", lambda o: o.verdict.extra_runs),
    *((f"  {cause}", (lambda c: lambda o: o.verdict.duplicates[c])(cause)) for cause in CAUSES),
    ("extra runs no process death explains", lambda o: o.verdict.extra_runs_without_a_death),
    ("pool children killed (SIGKILL)", lambda o: o.faults["child-kill"]),
    ("worker killed and restarted", lambda o: o.faults["worker-kill"]),
    ("SIGTERM, SIGKILL after the grace", lambda o: f"{o.faults['term-kill']} ({o.term_killed} killed)"),
    ("broker connection cut", lambda o: o.faults["connection-cut"]),
    ("worker paused past the visibility timeout", lambda o: o.faults["pause"]),
    ("worker's wall clock stepped", lambda o: o.faults["clock-step"]),
    ("worker crashes (exits not caused)", lambda o: len(o.crashes)),
    ("final warm shutdown exit status", lambda o: o.final_exit),
    ("messages left in the broker", lambda o: o.left_in_broker),
    ("log: connection lost", lambda o: o.log_counts["connection lost"]),
    ("log: child lost, task sent again", lambda o: o.log_counts["child lost, task sent again"]),
    ("log: ack failed", lambda o: o.log_counts["ack failed"]),
    ("log: tracebacks / CRITICAL", lambda o: f"{o.log_counts['tracebacks']} / {o.log_counts['critical']}"),
    ("log: leases lost after a pause", lambda o: o.log_counts["leases lost (after a pause)"]),
    ("log: copies dropped", lambda o: o.log_counts["copies dropped"]),
    ("log: wall clock jumps seen", lambda o: o.log_counts["wall clock jumps seen"]),
    ("publish (s)", lambda o: f"{o.publish_seconds:.1f}"),
    ("run until all ran (s)", lambda o: f"{o.run_seconds:.1f}"),
    ("settle (s)", lambda o: f"{o.settle_seconds:.1f}"),
    ("tasks/s under faults", lambda o: f"{o.verdict.tasks / o.run_seconds:.0f}"),
    ("seed", lambda o: o.seed),
]


def table(outcomes: Sequence[Outcome]) -> str:
    width = max(len(label) for label, _ in ROWS) + 2
    lines = [f"{'':{width}}" + "".join(f"{o.broker:>14}" for o in outcomes)]
    for label, value in ROWS:
        lines.append(f"{label:{width}}" + "".join(f"{value(o)!s:>14}" for o in outcomes))
    return "\n".join(lines)


def details(outcome: Outcome, limit: int = 10) -> str:
    """What went wrong, if anything: lost ids, unexplained duplicates, crashes, where the logs are."""
    lines: list[str] = []
    verdict = outcome.verdict
    if verdict.lost:
        lines.append(f"{outcome.broker}: lost {len(verdict.lost)}: {', '.join(verdict.lost[:limit])}")
    for previous, current in verdict.unexplained[:limit]:
        lines.append(f"{outcome.broker}: unexplained run of {current.task_id}: {previous} then {current}")
    if outcome.leftovers:
        runs = collections.Counter(outcome.leftovers)
        described = ", ".join(f"{task_id}" + (f" x{count}" if count > 1 else "")
                              for task_id, count in sorted(runs.items())[:limit])
        lines.append(f"{outcome.broker}: left in the broker: {described}")
    for generation, status in outcome.crashes:
        lines.append(f"{outcome.broker}: worker generation {generation} exited by itself ({status})")
    if outcome.stalled:
        lines.append(f"{outcome.broker}: no progress for the stall timeout; gave up waiting")
    if not outcome.clean:
        lines.append(f"{outcome.broker}: worker logs kept in {outcome.workdir}")
    return "\n".join(lines)

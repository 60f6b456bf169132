"""The prefork pool's hook implementations: its command-line option.

``--child-scheduler`` is the Linux CPU scheduling policy of the pool's children. ``batch`` (the
default) is ``SCHED_BATCH``: the same share of the CPU as any process, but a child woken by a
new job does not preempt the process running on its CPU, the worker's main process above all,
which reads the broker, feeds the children and acknowledges. ``normal`` is the kernel's default
policy. Elsewhere than Linux the option changes nothing.
"""

from __future__ import annotations

from worker_core import OptionSpec, hookimpl

__all__ = ["CHILD_SCHEDULERS", "child_scheduler", "worker_options"]

CHILD_SCHEDULERS = ("batch", "normal")


def child_scheduler(text: str) -> str:
    value = text.strip().lower()
    if value not in CHILD_SCHEDULERS:
        raise ValueError(f"must be batch or normal (got {text!r})")
    return value


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec("child_scheduler", ("--child-scheduler",), convert=child_scheduler, default="batch",
                   help="Linux CPU policy of prefork children: batch (default: a child woken by a job does "
                        "not preempt the main process) or normal."),
    ]

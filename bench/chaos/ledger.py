"""Reading the soak's ledger: the executions the task appended to a Redis list, tallied by task id."""

from __future__ import annotations

import collections

import attrs
import redis

__all__ = ["LEDGER_KEY", "Execution", "Ledger"]

#: The list ``bench/apps/soak_app.py`` appends to.
LEDGER_KEY = "soak:runs"


@attrs.frozen
class Execution:
    """One run of one task, as the task itself recorded it."""

    task_id: str
    pid: int
    generation: int
    redelivered: bool
    at: float

    @classmethod
    def parse(cls, line: bytes) -> Execution:
        task_id, pid, generation, redelivered, at = line.decode().split()
        return cls(task_id, int(pid), int(generation), redelivered == "1", float(at))


class Ledger:
    """Follows the ledger list incrementally: each :meth:`poll` reads only the new lines."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.executions: list[Execution] = []
        self.runs: collections.Counter[str] = collections.Counter()

    def clear(self) -> None:
        self.client.delete(LEDGER_KEY)
        self.executions.clear()
        self.runs.clear()

    def poll(self) -> int:
        """Read new executions; return how many arrived."""
        start = len(self.executions)
        lines = self.client.lrange(LEDGER_KEY, start, -1)
        for line in lines:
            execution = Execution.parse(line)
            self.executions.append(execution)
            self.runs[execution.task_id] += 1
        return len(lines)

    @property
    def distinct(self) -> int:
        return len(self.runs)

    def by_task(self) -> dict[str, list[Execution]]:
        grouped: dict[str, list[Execution]] = collections.defaultdict(list)
        for execution in self.executions:
            grouped[execution.task_id].append(execution)
        return grouped

    def close(self) -> None:
        self.client.close()

"""An app that takes part in the worker's run through hooks, without a distribution: it counts
the tasks each worker process starts (``task_prerun``, run where the task runs) and answers a
remote-control command of its own, ``tasks_seen`` (``worker_control_commands``).

    workerctl worker -A hooks_app -P solo -l INFO

The same functions, in a module named by a ``worker.plugins`` entry point, make a plugin.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from worker_core import App, Task

BROKER = os.environ.get("HOOKS_APP_BROKER", "redis://127.0.0.1:6379/12")
app = App("hooks_app", broker=BROKER, backend=BROKER)

_seen: dict[str, int] = {}
_lock = threading.Lock()


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.hook  # the function's name is the hook's; its arguments are a subset of the hook's
def task_prerun(task_id: str, task: Task) -> None:
    with _lock:
        _seen[task.name] = _seen.get(task.name, 0) + 1


def tasks_seen(worker: Any, **arguments: Any) -> dict[str, Any]:
    """The reply: how many times each task started in this process."""
    with _lock:
        return {"ok": dict(_seen)}


@app.hook
def worker_control_commands() -> dict[str, Any]:
    return {"tasks_seen": tasks_seen}

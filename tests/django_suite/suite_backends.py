"""The backends Django's task tests name, made worker_django's for the runner (:mod:`run` puts
them in place of Django's classes before the tests are imported):

- :class:`RunByWorker` for ``ImmediateBackend``: worker_django's backend on SUITE_RUN_BROKER,
  which a real worker consumes; ``enqueue`` returns once that worker ran the task, with the
  ``TaskResult`` read back from the result backend, and the worker's own ``django.tasks`` log
  records of it (RUNNING, then SUCCESSFUL or FAILED with the exception) logged again here, so
  the tests' ``assertLogs`` see what the worker logged.
- :class:`Queued` for ``DummyBackend``: worker_django's backend on SUITE_QUEUE_BROKER, which no
  worker consumes: each task stays READY. The dummy backend's test helpers are made of the real
  result backend: ``results`` reads every task enqueued here back from it, ``clear()`` deletes
  their records.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from worker_django import WorkerBackend

__all__ = ["JsonLines", "Queued", "RunByWorker"]

#: how long a task may take to be run and logged by the worker
TIMEOUT = 30.0
FINISHED = ("state=SUCCESSFUL", "state=FAILED")


class JsonLines(logging.FileHandler):
    """Each record as one JSON line: its level and its text as a formatter writes it (the
    message, then the exception's traceback)."""

    def __init__(self, filename: str) -> None:
        super().__init__(filename, mode="a", encoding="utf-8")
        self.setFormatter(logging.Formatter("%(message)s"))

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"level": record.levelno, "text": super().format(record)})


class _OnBroker(WorkerBackend):
    broker_variable = ""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if "broker_url" not in self.options:  # (the tests' TASKS entries have no OPTIONS)
            self.settings["broker_url"] = os.environ[self.broker_variable]


class RunByWorker(_OnBroker):
    broker_variable = "SUITE_RUN_BROKER"

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        from workers import wait_for  # (tests/workers.py: the runner's path has it; the worker's need not)

        result = super().enqueue(task, args, kwargs)

        def finished() -> bool:
            result.refresh()
            return bool(result.is_finished)

        wait_for(finished, TIMEOUT, interval=0.01, message=lambda: f"the worker to run {result.id}")
        records = wait_for(lambda: _worker_records(result.id), TIMEOUT, interval=0.01,
                           message=f"the worker's log of the end of {result.id}")
        for level, text in records:
            logging.getLogger("django.tasks").log(level, "%s", text)
        return result


def _worker_records(task_id: str) -> list[tuple[int, str]]:
    """The worker's ``django.tasks`` records of ``task_id`` once its last (the task finished) is
    written, else an empty list."""
    marker = f"id={task_id} "
    try:
        with open(os.environ["SUITE_TASK_LOG"], encoding="utf-8") as lines:
            found = [(record["level"], record["text"]) for record in map(json.loads, lines)
                     if marker in record["text"]]
    except FileNotFoundError:
        return []
    if any(state in text.partition("\n")[0] for _, text in found for state in FINISHED):
        return found
    return []


class Queued(_OnBroker):
    broker_variable = "SUITE_QUEUE_BROKER"

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._ids: list[str] = []

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        self._ids.append(result.id)
        return result

    @property
    def results(self) -> list[Any]:
        """Every task enqueued here, read back from the result backend."""
        return [self.get_result(task_id) for task_id in self._ids]

    def clear(self) -> None:
        """Delete the records of the tasks enqueued here."""
        for task_id in self._ids:
            self.app.backend.forget(task_id)
        self._ids.clear()

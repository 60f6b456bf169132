"""Running a blueprint: start in order, stop and terminate in reverse, unwind a failed start."""

from __future__ import annotations

import logging

import pytest

from worker_core.bootsteps import Blueprint, Step, resolve
from worker_core.options import WorkerOptions


class Recording(Step[list]):
    def __init__(self, name, *, fail_start=False, fail_stop=False, **kw):
        super().__init__(name, **kw)
        self.fail_start = fail_start
        self.fail_stop = fail_stop

    def start(self, parent):
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        parent.append(f"start {self.name}")

    def stop(self, parent):
        parent.append(f"stop {self.name}")
        if self.fail_stop:
            raise RuntimeError(f"{self.name} cannot stop")

    def terminate(self, parent):
        parent.append(f"terminate {self.name}")


def blueprint(*steps):
    return Blueprint(resolve("worker", list(steps), WorkerOptions()))


def test_steps_start_in_order_and_stop_in_reverse():
    events: list[str] = []
    bp = blueprint(Recording("A"), Recording("B", requires=["A"]), Recording("C", last=True))
    bp.start(events)
    bp.stop(events)
    assert events == ["start A", "start B", "start C", "stop C", "stop B", "stop A"]


def test_terminate_runs_in_reverse_too():
    events: list[str] = []
    bp = blueprint(Recording("A"), Recording("B", requires=["A"]))
    bp.start(events)
    bp.terminate(events)
    assert events[-2:] == ["terminate B", "terminate A"]


def test_a_failed_start_unwinds_the_started_steps_in_reverse_and_raises():
    events: list[str] = []
    bp = blueprint(Recording("A"), Recording("B", requires=["A"]),
                   Recording("C", requires=["B"], fail_start=True))
    with pytest.raises(RuntimeError, match="C cannot start"):
        bp.start(events)
    assert events == ["start A", "start B", "terminate B", "terminate A"]
    assert bp.started == ()


def test_an_error_while_stopping_is_logged_and_the_other_steps_still_stop(caplog):
    events: list[str] = []
    bp = blueprint(Recording("A"), Recording("B", requires=["A"], fail_stop=True))
    bp.start(events)
    with caplog.at_level(logging.ERROR, logger="worker.bootsteps"):
        bp.stop(events)
    assert events[-2:] == ["stop B", "stop A"]
    assert "error while stopping step B" in caplog.text

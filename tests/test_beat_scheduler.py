"""The scheduler's rules, driven by hand on the embedded broker (no threads, no server): a new entry
runs one interval after it is first seen; missed runs within the catch-up window are each sent
once, oldest first, and of older ones only the latest; an entry that skips missed runs skips them;
entries added, disabled and removed at run time are seen; an old leader is refused; and what is
sent is a Celery protocol v2 message with the entry's options."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from kombu.connection import Connection
from worker_beat.scheduler import Scheduler, tick_id
from worker_beat.schedules import crontab
from worker_beat.sources import SettingsSource, StoreSource

from worker_core import App
from worker_core.transports.embedded import EmbeddedTransport

UTC = timezone.utc


class Setup:
    def __init__(self, tmp_path: Path, schedule: dict[str, Any], **scheduler: Any) -> None:
        self.url = f"embedded://{tmp_path}/queue.db"
        self.app = App("sched", broker=self.url, result_backend="disabled")
        self.app.conf.update(beat_schedule=schedule)
        self.transport = EmbeddedTransport(self.url, self.app.settings)
        self.store = StoreSource(self.app, self.transport)
        self.scheduler = Scheduler(self.app, [SettingsSource(self.app), self.store], UTC, **scheduler)
        self.lease = self.transport.lease("beat", "test", ttl=30.0)
        self.token = self.lease.acquire()
        assert self.token is not None

    def run(self) -> float:
        return self.scheduler.duty(self.lease, self.lease.token or 0, time.monotonic() + 10)

    def records(self) -> dict[str, Any]:
        return {name: json.loads(text) for name, text in (self.lease.records() or {}).items()}

    def set_last(self, name: str, due: datetime) -> None:
        self.lease.write_records({name: json.dumps({"due": due.isoformat()})})

    def sent(self, queue: str = "celery") -> list[Any]:
        with Connection(
            self.url, transport=self.transport.kombu_transport(), **self.transport.connection_options()
        ) as connection:
            simple, found = connection.SimpleQueue(queue), []
            while True:
                try:
                    message = simple.get(timeout=0.2)
                except simple.Empty:
                    return found
                found.append(message)
                message.ack()

    def close(self) -> None:
        self.lease.close()
        self.store.close()
        self.app.close()


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    made: list[Setup] = []

    def make(schedule: dict[str, Any], **scheduler: Any) -> Setup:
        made.append(Setup(tmp_path, schedule, **scheduler))
        return made[-1]

    yield make
    for item in made:
        item.close()


def _dues(messages: list[Any]) -> list[datetime]:
    return [datetime.fromisoformat(message.headers["periodic_task_due"]) for message in messages]


def test_a_new_entry_runs_one_interval_after_it_is_first_seen(setup: Any) -> None:
    s = setup({"report": {"task": "proj.report", "schedule": 60.0}})
    before = datetime.now(UTC)
    s.run()
    anchor = datetime.fromisoformat(s.records()["report"]["due"])
    assert before <= anchor <= datetime.now(UTC)
    assert s.sent() == []
    [shown] = s.scheduler.snapshot()
    assert shown["next_run"] == (anchor + timedelta(seconds=60)).isoformat()


def test_runs_missed_within_the_window_are_each_sent_once_oldest_first(setup: Any) -> None:
    s = setup({"tick": {"task": "proj.tick", "schedule": 1.0}})
    last = datetime.now(UTC) - timedelta(seconds=5.5)
    s.set_last("tick", last)
    s.run()
    s.run()  # nothing is due again
    dues = _dues(s.sent())
    assert dues == [last + timedelta(seconds=n) for n in range(1, 6)]
    assert s.records()["tick"]["due"] == dues[-1].isoformat()


def test_of_runs_missed_before_the_window_only_the_latest_is_sent_when_none_is_within(setup: Any) -> None:
    s = setup(
        {
            "hourly": {"task": "proj.hourly", "schedule": crontab(minute=0)},
            "often": {"task": "proj.often", "schedule": 100.0},
        },
        catch_up=300.0,
    )
    now = datetime.now(UTC)
    s.set_last("hourly", now - timedelta(days=1))
    s.set_last("often", now - timedelta(seconds=10_000))
    s.run()
    sent = s.sent()
    hourly = [m for m in sent if m.headers["task"] == "proj.hourly"]
    often = [m for m in sent if m.headers["task"] == "proj.often"]
    assert _dues(hourly) == [now.replace(minute=0, second=0, microsecond=0)]  # once, the latest missed
    assert 2 <= len(often) <= 4 and all(due >= now - timedelta(seconds=300) for due in _dues(often))


def test_an_entry_that_skips_missed_runs_skips_those_due_before_the_lease_was_taken(setup: Any) -> None:
    s = setup({"tick": {"task": "proj.tick", "schedule": 1.0, "options": {"skip_missed": True}}})
    last = datetime.now(UTC) - timedelta(seconds=5.5)
    s.set_last("tick", last)
    s.run()
    # due 4.5 to 1.5 s before the lease was taken: skipped; 0.5 s before it: within the grace, sent
    assert _dues(s.sent()) == [last + timedelta(seconds=5)]
    assert s.scheduler.skipped == 4
    last = datetime.fromisoformat(s.records()["tick"]["due"])
    # a record behind the ticks sent (as after a restore of the broker's data): the runs missed
    # are skipped, and the one sent already is refused by its key, the second layer
    s.set_last("tick", last - timedelta(seconds=3))
    s.scheduler._term = None  # (a new term reads the records)
    s.run()
    assert s.sent() == [] and s.scheduler.sent_already == 1
    assert s.records()["tick"]["due"] == last.isoformat()


def test_entries_added_disabled_and_removed_at_run_time_are_seen(setup: Any) -> None:
    s = setup({"report": {"task": "proj.report", "schedule": 1.0}}, max_interval=0.05)
    s.run()
    s.store.add("extra", {"task": "proj.extra", "schedule": {"every": 1}, "options": {"queue": "extra"}})
    time.sleep(0.06)  # past max_interval: the sources are looked at again
    s.run()
    assert {entry["name"] for entry in s.scheduler.snapshot()} == {"report", "extra"}
    s.store.switch("report", False, in_settings=True)
    s.store.remove("extra")
    time.sleep(0.06)  # past max_interval again
    s.run()
    assert s.scheduler.snapshot() == [] and s.records() == {}


def test_an_old_leader_that_lost_the_lease_sends_nothing(tmp_path: Path, setup: Any) -> None:
    s = setup({"tick": {"task": "proj.tick", "schedule": 1.0}})
    s.set_last("tick", datetime.now(UTC) - timedelta(seconds=2.5))
    old = s.transport.lease("beat", "old", ttl=1.0)
    s.lease.release()
    assert old.acquire() is not None
    s.lease = old
    s.run()
    time.sleep(1.1)  # the old leader's lease lapses, a new one takes it
    new = s.transport.lease("beat", "new", ttl=30.0)
    assert new.acquire() is not None
    s.set_last = lambda name, due: None  # (the old leader's view is what it read)
    s.scheduler._term = None  # it still thinks it leads, with its old token
    sent_before = len(s.sent())
    assert s.scheduler.duty(old, 1, time.monotonic() + 5) == 0.0  # refused: it stops
    assert s.sent() == [] and sent_before == 2
    new.close()


def test_a_tick_is_a_celery_protocol_v2_message_with_the_entrys_options(setup: Any) -> None:
    s = setup(
        {
            "report": {
                "task": "proj.report",
                "schedule": 1.0,
                "args": (1, "a"),
                "kwargs": {"n": 2},
                "options": {"queue": "reports", "priority": 7, "expires": 60, "headers": {"x": "1"}},
            }
        }
    )
    last = datetime.now(UTC) - timedelta(seconds=1.5)
    s.set_last("report", last)
    s.run()
    [message] = s.sent("reports")
    due = last + timedelta(seconds=1)
    headers = message.headers
    assert headers["task"] == "proj.report" and headers["lang"] == "py"
    assert headers["id"] == headers["root_id"] == tick_id("report", due)
    assert headers["periodic_task_name"] == "report" and headers["x"] == "1"
    assert datetime.fromisoformat(headers["expires"]) > datetime.now(UTC)
    assert message.properties["priority"] == 7
    assert json.loads(message.body) == [
        [1, "a"],
        {"n": 2},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]

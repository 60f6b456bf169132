"""The scheduler: the leader's duty. While its process holds the lease it keeps each entry's next
run, and sends every tick that is due with the lease's send-once (the tick's key is
``entry@due-time``), which records the entry's last run on the broker in the same step.

**State.** The broker keeps, with the lease, one record per entry: the due time of its last tick
(or, for an entry no scheduler has run yet, the time the first one saw it: its first run is one
interval later, as under Celery's beat), when and by whom it was sent, and the task's id. A new
leader reads them when it takes the lease, so it carries on from the last tick sent, whoever sent
it: a tick due during a takeover is sent late, once.

**Missed runs.** Each run that came due since the last one is sent, oldest first, when it fell
within ``beat_catch_up_window`` seconds (300) of now; of the ones before that only the latest is
sent, once (Celery's beat sends one run for a stretch it missed), and only when none falls within
the window. An entry with ``options={"skip_missed": True}`` skips the runs that came due while no
scheduler held the lease; ``beat_cron_starting_deadline`` skips crontab runs older than it. A
disabled entry owes nothing for the time it was disabled.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

import attrs

from worker_core.exceptions import LeaseLost
from worker_core.slots import Lease, SendsOnce

from .entries import Entry
from .schedules import crontab, every
from .sources import ScheduleSource, StoreSource

__all__ = ["KEEP", "Scheduler", "Tick", "tick_id", "tick_key"]

logger = logging.getLogger("worker.beat")

UTC = timezone.utc
#: seconds a tick's key is kept by the broker (it refuses the same tick again within them)
KEEP = 60.0
#: seconds before the lease was taken within which a run is not counted as missed
MISSED_GRACE = 1.0
#: records written to the broker in one step when a new term sees many new entries
BATCH = 500
#: runs of one entry worked out in one look at it before the rest are skipped as too many
MOST_RUNS = 100_000
#: the namespace of the tasks' ids: one id per entry and due time (the same on every scheduler)
ID_NAMESPACE = uuid.UUID("0b1e5b2c-6a1f-4c0e-9d2f-5a8e3c7b9d10")


def tick_key(name: str, due: datetime) -> str:
    """A tick's key: ``entry@due-time`` (the due time in UTC, to the microsecond)."""
    return f"{name}@{due.astimezone(UTC).isoformat()}"


def tick_id(name: str, due: datetime) -> str:
    """The task id a tick is sent with: a UUID made from its key, so a run can be told apart
    from any other run of the entry by its id alone."""
    return str(uuid.uuid5(ID_NAMESPACE, tick_key(name, due)))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def _moment(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@attrs.frozen
class Tick:
    """One run of an entry, with what became of it."""

    name: str
    due: datetime
    #: ``sent``, ``sent-already`` (another scheduler sent it), ``skipped`` or ``failed``
    outcome: str
    task_id: str | None = None
    sent_at: datetime | None = None


class _State:
    """What the scheduler knows of one entry."""

    __slots__ = ("entry", "error", "last", "last_due", "next_due")

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.last_due: datetime | None = None
        self.next_due: datetime | None = None
        #: the entry's record on the broker, decoded
        self.last: dict[str, Any] = {}
        self.error: str | None = None


class Scheduler:
    """Works out and sends the due ticks of the entries its sources give, under a lease that
    :class:`~worker_core.slots.SendsOnce` (its :meth:`duty` is an election's).

    :param app: the :class:`~worker_core.App` the tasks are sent through
    :param sources: the settings source first, then the dynamic one, if any
    :param zone: the time zone crontabs are read in
    :param on_tick: called with each :class:`Tick` (in the election's thread)
    """

    def __init__(self, app: Any, sources: Sequence[ScheduleSource], zone: tzinfo, *, catch_up: float = 300.0,
                 cron_deadline: float | None = None, max_interval: float = 1.0,
                 on_tick: Any = None) -> None:
        self.app = app
        self.sources = list(sources)
        self.zone = zone
        self.catch_up = catch_up
        self.cron_deadline = cron_deadline
        self.max_interval = max_interval if max_interval > 0 else 1.0
        self.on_tick = on_tick
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._states: dict[str, _State] = {}
        self._heap: list[tuple[datetime, int, str]] = []
        self._serial = 0
        self._term: int | None = None
        self._term_started = 0.0
        self._next_refresh = 0.0
        self._refresh_needed = True
        #: ticks sent by this scheduler, and those it found sent already
        self.sent = 0
        self.sent_already = 0
        self.skipped = 0

    # -- the entries ----------------------------------------------------------------------------

    def load(self) -> dict[str, Entry]:
        """The entries every source gives now (settings first); a stored entry named as a
        settings entry only disables or enables that one."""
        merged: dict[str, Entry] = {}
        for source in self.sources:
            for name, entry in source.entries().items():
                if name in merged:
                    logger.warning("The stored schedule entry %r has the name of an entry of beat_schedule, "
                                   "which wins; rename it", name)
                    continue
                merged[name] = entry
            if isinstance(source, StoreSource):
                for name, (enabled, since) in source.overrides().items():
                    if name in merged and merged[name].source == "settings":
                        merged[name] = attrs.evolve(merged[name], enabled=enabled, since=since)
        return {name: entry for name, entry in merged.items() if entry.enabled}

    def check(self) -> dict[str, Entry]:
        """Load the entries once, so a bad one stops the scheduler before it starts."""
        entries = self.load()
        with self._lock:
            self._entries = entries
        return entries

    # -- the duty --------------------------------------------------------------------------------

    def duty(self, lease: Lease, token: int, deadline: float) -> float:
        """Send what is due (an :class:`~worker_core.election.Election`'s duty); the seconds
        until it is worth calling again."""
        if not isinstance(lease, SendsOnce):
            raise TypeError(f"the lease {lease!r} cannot send once: its transport does not offer SendsOnce")
        if token != self._term:
            self._begin(lease, token)
        now = time.monotonic()
        if now >= self._next_refresh or self._refresh_needed:
            self._refresh(lease)
            self._next_refresh = now + self.max_interval
        try:
            self._send_due(lease, token, deadline)
        except LeaseLost as exc:
            logger.warning("Stopped sending: %s", exc)
            self._term = None
            return 0.0
        with self._lock:
            head = self._heap[0][0] if self._heap else None
        wait = self.max_interval if head is None else (head - datetime.now(UTC)).total_seconds()
        return max(0.0, min(wait, self._next_refresh - time.monotonic(), self.max_interval))

    def stopped_leading(self) -> None:
        """The lease is gone: forget the term (the next one reads the broker's records again)."""
        self._term = None

    def _begin(self, lease: SendsOnce, token: int) -> None:
        records = lease.records() or {}
        self._term = token
        self._term_started = time.time()
        self._refresh_needed = True
        with self._lock:
            self._states = {}
            self._heap = []
        self._records = {name: self._decode(text) for name, text in records.items()}
        logger.info("Sending the periodic tasks (lease token %d, %d entries recorded)", token, len(records))

    @staticmethod
    def _decode(text: str) -> dict[str, Any]:
        try:
            record = json.loads(text)
        except ValueError:
            return {}
        return record if isinstance(record, dict) else {}

    def _refresh(self, lease: SendsOnce) -> None:
        changed = self._refresh_needed or any(source.changed() for source in self.sources)
        self._refresh_needed = False
        if not changed:
            return
        try:
            entries = self.load()
        except Exception as exc:  # the settings were checked at start: a dynamic source failing
            logger.error("Could not read the schedule's entries: %s: %s", type(exc).__name__, exc)
            return
        now = datetime.now(UTC)
        anchors: dict[str, str | None] = {}
        with self._lock:
            states = self._states
            for name in list(states):
                if name not in entries:
                    del states[name]
            for name, entry in entries.items():
                state = states.get(name)
                if state is not None and state.entry.same_as(entry):
                    state.entry = entry
                    continue
                old, state = state, _State(entry)
                states[name] = state
                if old is not None:  # changed: it carries on from its last run
                    state.last, state.last_due = old.last, old.last_due
                    continue
                record = self._records.get(name, {})
                state.last = record
                state.last_due = _moment(record.get("due"))
                if state.last_due is None:
                    state.last_due = now
                    anchors[name] = json.dumps({"due": _iso(now), "seen": True})
                state.next_due = None
            self._entries = entries
            self._heap = []
            for state in states.values():
                self._push(state)
        gone = [name for name in self._records if name not in entries]
        for name in gone:
            anchors[name] = None  # an entry no source gives any more: its state goes with it
            del self._records[name]
        items = list(anchors.items())
        for start in range(0, len(items), BATCH):
            lease.write_records(dict(items[start:start + BATCH]))
        for name, value in anchors.items():
            if value is not None:
                self._records[name] = json.loads(value)

    def _push(self, state: _State) -> None:
        entry = state.entry
        if state.next_due is None:
            assert state.last_due is not None
            start = state.last_due
            if entry.since is not None:
                since = datetime.fromtimestamp(entry.since, UTC)
                start = max(start, since)
            try:
                state.next_due = entry.schedule.next_after(start, self.zone)
            except Exception as exc:
                state.error = f"{type(exc).__name__}: {exc}"
                logger.error("The schedule of entry %r failed: %s", entry.name, state.error)
                return
        self._serial += 1
        heapq.heappush(self._heap, (state.next_due, self._serial, entry.name))

    def _send_due(self, lease: SendsOnce, token: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            now = datetime.now(UTC)
            with self._lock:
                if not self._heap or self._heap[0][0] > now:
                    return
                _, _, name = heapq.heappop(self._heap)
                state = self._states.get(name)
            if state is None:
                continue
            try:
                self._run_entry(lease, token, state, now)
            finally:
                with self._lock:
                    if self._states.get(name) is state:
                        self._push(state)

    def _due_runs(self, state: _State, now: datetime) -> tuple[list[datetime], list[datetime]]:
        """The runs of the entry due by ``now``: those to send and those to skip (both oldest
        first), from the next one on; leaves ``state.next_due`` at the first one after ``now``."""
        entry, schedule = state.entry, state.entry.schedule
        window = now - timedelta(seconds=self.catch_up)
        due = state.next_due
        assert due is not None
        send: list[datetime] = []
        skip: list[datetime] = []
        older: datetime | None = None
        counted = 0
        if isinstance(schedule, every) and not schedule.relative and due < window:
            # an interval far behind: straight to the last run before the window
            step = timedelta(seconds=schedule.seconds)
            behind = int((window - due) / step)
            if behind > 0:
                skip_to = due + step * (behind - 1)
                older, due = skip_to, skip_to + step
        while due <= now:
            if due < window:
                if older is not None:
                    skip.append(older)
                older = due
            else:
                send.append(due)
            due = schedule.next_after(due, self.zone)
            counted += 1
            if counted >= MOST_RUNS:
                logger.warning("Entry %r: more than %d runs missed; the rest are skipped", entry.name,
                               MOST_RUNS)
                while due <= now:
                    due = schedule.next_after(max(due, window), self.zone)
                break
        state.next_due = due
        if older is not None:
            # of the runs before the window only the latest is sent, and only when none is within it
            if send:
                skip.append(older)
            else:
                send.append(older)
        if self.cron_deadline is not None and isinstance(schedule, crontab):
            limit = now - timedelta(seconds=self.cron_deadline)
            skip += [run for run in send if run < limit]
            send = [run for run in send if run >= limit]
        if entry.skip_missed:
            missed_before = datetime.fromtimestamp(self._term_started - MISSED_GRACE, UTC)
            skip += [run for run in send if run < missed_before]
            send = [run for run in send if run >= missed_before]
        return send, sorted(skip)

    def _run_entry(self, lease: SendsOnce, token: int, state: _State, now: datetime) -> None:
        send, skip = self._due_runs(state, now)
        if skip and not send:
            # nothing to send: the record moves past the skipped runs, so no scheduler owes them
            last = skip[-1]
            record = {**state.last, "due": _iso(last), "skipped": True}
            lease.write_records({state.entry.name: json.dumps(record)})
            state.last_due, state.last = last, record
            self._records[state.entry.name] = record
            self.skipped += len(skip)
            self._report_many(state.entry.name, skip, "skipped")
            return
        if skip:
            self.skipped += len(skip)
            self._report_many(state.entry.name, skip, "skipped")
        for due in send:
            if not self._send(lease, token, state, due):
                # not sent (the broker failed): this run and the rest wait for the next look
                state.next_due = due
                return

    def _report_many(self, name: str, runs: list[datetime], outcome: str) -> None:
        if runs:
            logger.info("Entry %r: %d missed run(s) skipped (%s to %s)", name, len(runs), _iso(runs[0]),
                        _iso(runs[-1]))
        if self.on_tick is not None:
            for run in runs:
                self.on_tick(Tick(name, run, outcome))

    def _send(self, lease: SendsOnce, token: int, state: _State, due: datetime) -> bool:
        entry = state.entry
        key, task_id = tick_key(entry.name, due), tick_id(entry.name, due)
        sent_at = datetime.now(UTC)
        holder = getattr(lease, "holder", "")  # a Lease (SendsOnce is its capability)
        record = {"due": _iso(due), "sent": _iso(sent_at), "id": task_id, "by": holder, "token": token}
        headers = {"periodic_task_name": entry.name, "periodic_task_due": _iso(due),
                   **dict(entry.options.get("headers") or {})}
        options = {**entry.options, "headers": headers}

        def publish(producer: Any) -> None:
            task = self.app.tasks.get(entry.task)
            send = task.apply_async if task is not None else self._send_by_name(entry.task)
            send(entry.args, dict(entry.kwargs), producer=producer, task_id=task_id, retry=False, **options)

        try:
            sent = lease.send_once(key, publish, record=(entry.name, json.dumps(record)), keep=KEEP)
        except LeaseLost:
            raise
        except (TypeError, ValueError) as exc:
            # the entry cannot be sent as it is (an option the client refuses): logged, not retried
            state.error = f"{type(exc).__name__}: {exc}"
            logger.error("Entry %r cannot be sent: %s", entry.name, state.error)
            failed = {**state.last, "due": _iso(due), "error": state.error}
            lease.write_records({entry.name: json.dumps(failed)})
            state.last_due, state.last = due, failed
            self._records[entry.name] = failed
            self._tick(Tick(entry.name, due, "failed"))
            return True
        except Exception as exc:
            state.error = f"{type(exc).__name__}: {exc}"
            logger.warning("Entry %r: the run due at %s was not sent (%s); trying again", entry.name,
                           _iso(due), state.error)
            return False
        state.error = None
        state.last_due = due
        if sent:
            state.last = self._records[entry.name] = record
            self.sent += 1
            logger.info("Sent %s (%s) due %s", entry.name, entry.task, _iso(due))
            self._tick(Tick(entry.name, due, "sent", task_id, sent_at))
        else:
            # sent before (its key says so), though the record was behind: the record catches up
            caught_up = {**state.last, "due": _iso(due), "id": task_id}
            lease.write_records({entry.name: json.dumps(caught_up)})
            state.last = self._records[entry.name] = caught_up
            self.sent_already += 1
            self._tick(Tick(entry.name, due, "sent-already", task_id))
        return True

    def _send_by_name(self, name: str) -> Any:
        def send(args: Any, kwargs: Any, **options: Any) -> Any:
            return self.app.send_task(name, args, kwargs, **options)

        return send

    def _tick(self, tick: Tick) -> None:
        if self.on_tick is not None:
            self.on_tick(tick)

    # -- what inspect shows ----------------------------------------------------------------------

    @property
    def entry_count(self) -> int:
        return len(self._entries)

    def snapshot(self) -> list[dict[str, Any]]:
        """Each entry, its schedule, next run and last send, as this scheduler knows them."""
        with self._lock:
            entries = dict(self._entries)
            states = dict(self._states)
        shown = []
        for name, entry in sorted(entries.items()):
            state = states.get(name)
            last = state.last if state is not None else {}
            shown.append({
                "name": name, "task": entry.task, "schedule": entry.schedule.describe(),
                "source": entry.source,
                "next_run": _iso(state.next_due) if state is not None and state.next_due else None,
                "last_due": last.get("due") if last.get("sent") else None,
                "last_sent": last.get("sent"), "last_id": last.get("id"), "sent_by": last.get("by"),
                "error": state.error if state is not None else None,
            })
        return shown

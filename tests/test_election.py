"""An Election holds one lease among many processes: one leads and does its duty, the others wait;
a stopped leader hands over at once, a leader that goes silent hands over within the lease's bound
(the embedded file's leases: no server needed; the lease contract covers every broker)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from workers import wait_for

from worker_core.app.settings import Settings
from worker_core.election import Election, check_lease
from worker_core.exceptions import ConfigurationError
from worker_core.slots import Lease
from worker_core.transports.embedded import EmbeddedTransport

TTL = 1.0


@pytest.fixture
def transport(tmp_path: Path) -> EmbeddedTransport:
    return EmbeddedTransport(f"embedded://{tmp_path}/queue.db", Settings())


class Duties:
    """Counts the duty's calls per holder, with the token each was given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int]] = []

    def duty(self, lease: Lease, token: int, deadline: float) -> float:
        assert deadline > time.monotonic() - 0.5  # the deadline is the next renewal, ahead
        with self.lock:
            self.calls.append((lease.holder, token))
        return 0.05

    def holders(self) -> set[str]:
        with self.lock:
            return {holder for holder, _ in self.calls}


def test_one_of_several_elections_leads_and_does_its_duty(transport: EmbeddedTransport) -> None:
    duties = Duties()
    elections = [Election(transport.lease("job", f"node{n}", ttl=TTL), duty=duties.duty) for n in range(3)]
    for election in elections:
        election.start()
    try:
        wait_for(lambda: any(election.leading for election in elections), 10, message="a leader")
        wait_for(lambda: len(duties.calls) >= 5, 10, message="the duty to run")
        leaders = [election for election in elections if election.leading]
        assert len(leaders) == 1
        assert duties.holders() == {leaders[0].lease.holder}
        assert {token for _, token in duties.calls} == {leaders[0].token}
    finally:
        for election in elections:
            election.stop()


def test_a_stopped_leader_hands_over_at_once(transport: EmbeddedTransport) -> None:
    changes: list[bool] = []
    first = Election(transport.lease("job", "first", ttl=10.0), on_change=changes.append)
    second = Election(transport.lease("job", "second", ttl=10.0))
    first.start()
    assert first.wait_leading(10)
    second.start()
    try:
        token = first.token
        assert token is not None and not second.leading
        started = time.monotonic()
        first.stop()
        assert changes == [True, False] and not first.leading
        assert second.wait_leading(5), "the standby did not take over after the leader stopped"
        assert time.monotonic() - started < 5  # well inside the ttl of 10 s: the lease was released
        assert second.token is not None and second.token > token
    finally:
        second.stop()


def test_a_silent_leader_loses_the_lease_within_its_ttl(transport: EmbeddedTransport) -> None:
    silent = transport.lease("job", "silent", ttl=TTL)
    token = silent.acquire()  # held, and never renewed: a paused leader
    assert token is not None
    standby = Election(transport.lease("job", "standby", ttl=TTL))
    standby.start()
    try:
        assert standby.wait_leading(TTL + 5)
        assert standby.token is not None and standby.token > token
        assert not silent.renew()
    finally:
        standby.stop()
        silent.close()


class FakeLease:
    """An in-memory lease whose broker the test scripts: the methods an Election calls besides
    acquire and renew, which each test writes."""

    name, holder = "job", "node#1"
    token: int | None = None

    def __init__(self, ttl: float) -> None:
        self.ttl = self.bound = ttl

    def release(self) -> None:
        self.token = None

    def current(self) -> None:
        return None

    def close(self) -> None:
        pass


def test_a_leader_that_cannot_reach_its_broker_stops_leading_after_the_ttl() -> None:
    class Unreachable(FakeLease):
        """A lease whose broker answers once, then never again."""

        def acquire(self, wait: float = 0.0) -> int | None:
            if self.token is None:
                self.token = 1
                return 1
            raise ConnectionError("the broker does not answer")

        def renew(self) -> bool:
            raise ConnectionError("the broker does not answer")

    election = Election(Unreachable(TTL))  # type: ignore[arg-type]
    election.start()
    try:
        assert election.wait_leading(5)
        started = time.monotonic()
        wait_for(lambda: not election.leading, TTL + 5, message="the leader to step down")
        assert time.monotonic() - started <= TTL + 0.5
        assert election.last_error == "ConnectionError: the broker does not answer"
    finally:
        election.stop()


@pytest.mark.parametrize("reachable", [False, True], ids=["broker-gone", "duty-bug"])
def test_a_failing_duty_is_one_line_when_the_broker_is_gone_and_a_traceback_when_it_is_a_bug(
    reachable: bool, caplog: pytest.LogCaptureFixture
) -> None:
    class Flaky(FakeLease):
        """A lease whose broker answers until the duty runs, then answers only if reachable."""

        down = False

        def acquire(self, wait: float = 0.0) -> int | None:
            self.token = 1
            return 1

        def renew(self) -> bool:
            if self.down:
                raise ConnectionError("Connection closed by server.")
            return True

    lease = Flaky(30.0)
    calls: list[int] = []

    def duty(lease_: Lease, token: int, deadline: float) -> float:
        calls.append(token)
        lease.down = not reachable
        if reachable:
            raise KeyError("a bug in the duty")
        raise ConnectionError("Connection closed by server.")

    election = Election(lease, duty=duty)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="worker_core.election"):
        election.start()
        try:
            wait_for(lambda: len(calls) >= (3 if reachable else 1), 10, message="the duty to run and fail")
            wait_for(lambda: reachable or election.last_error is not None, 10,
                     message="the broker's error to be recorded")
        finally:
            election.stop()
    failures = [record for record in caplog.records if "duty of the lease" in record.getMessage()]
    if reachable:
        assert failures and all(record.exc_info and record.levelname == "ERROR" for record in failures)
        assert "KeyError: 'a bug in the duty'" in caplog.text
        assert election.terms == 1  # the renewal after each failure kept the lease
    else:
        assert [record.getMessage() for record in failures] == [
            "Could not do the duty of the lease 'job': ConnectionError: Connection closed by server."]
        assert not any(record.exc_info for record in caplog.records)
        assert "Traceback" not in caplog.text


@pytest.mark.parametrize(("name", "ttl"), [("has space", 1.0), ("", 1.0), ("ok", 0), ("ok", float("inf")),
                                           ("ok", True)])
def test_a_bad_lease_name_or_ttl_is_refused(name: str, ttl: float) -> None:
    with pytest.raises(ConfigurationError, match="lease"):
        check_lease(name, ttl)

"""The lease contract suite: checks a transport that :class:`~worker_core.slots.ElectsLeaders`
(and its leases that :class:`~worker_core.slots.SendsOnce`, and its record tables when it
:class:`~worker_core.slots.KeepsRecords`) against a real broker of its kind.

A third-party transport runs it as the transport contract is run::

    from worker_core.testing import lease_contract

    lease_contract.run_all(MyTransport, "mybroker://127.0.0.1:7000/")

    @pytest.mark.parametrize("check", lease_contract.CHECKS, ids=lease_contract.check_name)
    def test_my_transport_honours_the_lease_contract(check):
        check(MyTransport, "mybroker://127.0.0.1:7000/")

Each check uses leases named ``contract.<check>`` (so runs reuse them: tokens only grow) with a
ttl of :data:`TTL` seconds, and queues named ``contract-<uuid>``, which it deletes. A check that
cuts a connection puts a TCP proxy in front of the broker; against a broker with no network (a
local file) it checks nothing more. Each raises ``AssertionError`` naming the transport and what
it did wrong.

One module, as every shipped suite: a third party imports one name and runs it.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from kombu.connection import Connection
from kombu.entity import Exchange, Queue

from ..app.settings import Settings
from ..exceptions import ConfigurationError, LeaseLost
from ..slots import ElectsLeaders, KeepsRecords, Lease, RecordTable, SendsOnce, Transport
from .proxy import proxied

__all__ = ["CHECKS", "SLACK", "TTL", "Check", "check_name", "run_all"]

#: the leases' ttl in the checks (RabbitMQ's leases last two seconds or more)
TTL = 2.0
#: seconds beyond a lease's bound a takeover may take on a loaded machine
SLACK = 3.0


class Check(Protocol):
    __name__: str

    def __call__(self, transport: type[Transport], url: str, *, settings: Settings | None = None) -> None: ...


def _expect(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)


class _Broker:
    """The transport of one check, its leases, and the connections and queues it used."""

    def __init__(self, transport: type[Transport], url: str, settings: Settings | None, check: str) -> None:
        self.label = f"{transport.__module__}.{transport.__qualname__}"
        self.settings = settings or Settings()
        self.url = url
        self.transport = transport(url, self.settings)
        self.name = f"contract.{check}"
        self.leases: list[Lease] = []
        self.connections: list[Any] = []
        self.queues: list[Any] = []

    def elects(self) -> ElectsLeaders:
        _expect(isinstance(self.transport, ElectsLeaders),
                f"{self.label} does not offer ElectsLeaders (a lease(name, holder, *, ttl) method)")
        assert isinstance(self.transport, ElectsLeaders)
        return self.transport

    def lease(self, holder: str, url: str | None = None) -> Lease:
        transport = self.transport if url is None else type(self.transport)(url, self.settings)
        assert isinstance(transport, ElectsLeaders)
        lease = transport.lease(self.name, holder, ttl=TTL)
        _expect(isinstance(lease, Lease), f"{self.label}.lease() returned {lease!r}, which is not a Lease")
        self.leases.append(lease)
        return lease

    def held(self, lease: Lease, wait: float) -> int:
        """Acquire ``lease`` (another check's holder may still hold it: wait for the bound)."""
        token = lease.acquire(wait=wait)
        _expect(isinstance(token, int) and not isinstance(token, bool),
                f"{self.label}: {lease.holder} could not acquire the free lease {self.name!r} within "
                f"{wait:g}s (acquire returned {token!r})")
        assert token is not None
        _expect(lease.token == token,
                f"{self.label}: lease.token is {lease.token!r} after acquire returned {token}")
        return token

    def connect(self) -> Any:
        connection = Connection(
            self.url, transport=self.transport.kombu_transport(), **self.transport.connection_options())
        connection.connect()
        self.connections.append(connection)
        return connection

    def queue(self) -> Any:
        queue = Queue(f"contract-{uuid.uuid4().hex}", Exchange(""), durable=True)
        queue(self.connect().default_channel).declare()
        self.queues.append(queue)
        return queue

    def messages(self, queue: Any, settle: float = 0.5) -> list[Any]:
        """Every message in ``queue`` (taken off it), waiting ``settle`` seconds after the last."""
        connection = self.connect()
        bodies: list[Any] = []
        simple = connection.SimpleQueue(queue.name)
        while True:
            try:
                message = simple.get(timeout=settle)
            except simple.Empty:
                return bodies
            bodies.append(message.decode())
            message.ack()

    def close(self) -> None:
        for lease in self.leases:
            with contextlib.suppress(Exception):
                lease.close()
        for queue in self.queues:
            with contextlib.suppress(Exception):
                queue(self.connect().default_channel).delete()
        for connection in self.connections:
            with contextlib.suppress(Exception):
                connection.release()


@contextlib.contextmanager
def _broker(transport: type[Transport], url: str, settings: Settings | None, check: str) -> Iterator[_Broker]:
    broker = _Broker(transport, url, settings, check)
    try:
        yield broker
    finally:
        broker.close()


def _publisher(queue: Any, body: Any) -> Callable[[Any], None]:
    def publish(producer: Any) -> None:
        producer.publish(body, exchange="", routing_key=queue.name, serializer="json", declare=[queue])

    return publish


def _free_wait(lease: Lease) -> float:
    """How long a first acquire may wait: a holder of an earlier run may hold it still."""
    return lease.bound + SLACK


# -- the checks -----------------------------------------------------------------------------------


def check_leases_are_made_and_named(transport: type[Transport], url: str, *,
                                    settings: Settings | None = None) -> None:
    """``lease()`` gives a :class:`~worker_core.slots.Lease` with its name, ttl, a bound, and a
    holder name unique to the object; a bad name or ttl is a ``ConfigurationError``."""
    with _broker(transport, url, settings, "made") as broker:
        elects = broker.elects()
        first, second = broker.lease("node"), broker.lease("node")
        _expect(first.name == broker.name and first.ttl == TTL,
                f"{broker.label}: the lease has name {first.name!r} and ttl {first.ttl!r}, not "
                f"{broker.name!r} and {TTL}")
        _expect(first.holder != second.holder and first.holder.startswith("node"),
                f"{broker.label}: two leases for holder 'node' are named {first.holder!r} and "
                f"{second.holder!r}: each must be unique and start with the name given")
        _expect(isinstance(first.bound, (int, float)) and first.bound >= first.ttl * 0.5,
                f"{broker.label}: the lease's bound is {first.bound!r}")
        _expect(first.token is None, f"{broker.label}: a new lease has token {first.token!r}, not None")
        for name, ttl in (("bad name", 1.0), ("ok", 0.0), ("ok", -1.0)):
            try:
                elects.lease(name, "node", ttl=ttl)
            except ConfigurationError:
                continue
            raise AssertionError(f"{broker.label}.lease({name!r}, ttl={ttl}) was accepted")


def check_one_holder_at_a_time(transport: type[Transport], url: str, *,
                               settings: Settings | None = None) -> None:
    """While one holds the lease, another's ``acquire`` returns None; ``current()`` says who
    holds it; a holder's ``acquire`` again keeps its token."""
    with _broker(transport, url, settings, "one") as broker:
        first, second = broker.lease("first"), broker.lease("second")
        token = broker.held(first, _free_wait(first))
        _expect(second.acquire(wait=0.5) is None and second.token is None,
                f"{broker.label}: a second holder acquired the lease {broker.name!r} while the first held it")
        state = second.current()
        _expect(state is not None and state.holder in (first.holder, None),
                f"{broker.label}: current() says {state!r} while {first.holder} holds the lease")
        assert state is not None
        _expect(state.token in (token, None),
                f"{broker.label}: current() gives token {state.token}, not {token}")
        _expect(first.acquire() == token, f"{broker.label}: the holder's acquire again changed its token")


def check_a_release_hands_the_lease_over_at_once(transport: type[Transport], url: str, *,
                                                 settings: Settings | None = None) -> None:
    """After ``release()`` the next caller holds the lease without waiting for the deadline,
    under a larger token."""
    with _broker(transport, url, settings, "release") as broker:
        first, second = broker.lease("first"), broker.lease("second")
        token = broker.held(first, _free_wait(first))
        _expect(second.acquire(wait=0.2) is None, f"{broker.label}: the second holder acquired a held lease")
        first.release()
        _expect(first.token is None, f"{broker.label}: token is {first.token!r} after release()")
        started = time.monotonic()
        taken = broker.held(second, SLACK)
        elapsed = time.monotonic() - started
        _expect(taken > token, f"{broker.label}: the next holding has token {taken}, not more than {token}")
        _expect(elapsed < TTL, f"{broker.label}: the lease was taken {elapsed:.1f}s after its release, not "
                               f"at once (its ttl is {TTL}s)")
        _expect(not first.renew(), f"{broker.label}: renew() after release() said the lease is still held")


def check_renewing_keeps_the_lease(transport: type[Transport], url: str, *,
                                   settings: Settings | None = None) -> None:
    """A holder that renews every ttl / 4 keeps the lease past its ttl."""
    with _broker(transport, url, settings, "renew") as broker:
        first, second = broker.lease("first"), broker.lease("second")
        token = broker.held(first, _free_wait(first))
        until = time.monotonic() + 2 * TTL
        while time.monotonic() < until:
            _expect(first.renew(), f"{broker.label}: renew() every {TTL / 4:g}s lost the lease")
            _expect(second.acquire(wait=TTL / 4) is None,
                    f"{broker.label}: another acquired the lease while its holder renewed it")
        _expect(first.token == token, f"{broker.label}: renewing changed the token")


def check_a_silent_holder_loses_the_lease_within_its_bound(transport: type[Transport], url: str, *,
                                                           settings: Settings | None = None) -> None:
    """A holder that stops renewing (paused, stuck) loses the lease within its bound: another
    holds it then under a larger token, the old holder's ``renew()`` says so, and what the old
    holder sends or writes under it is refused (when the lease ``SendsOnce``)."""
    with _broker(transport, url, settings, "silent") as broker:
        first, second = broker.lease("first"), broker.lease("second")
        token = broker.held(first, _free_wait(first))
        started = time.monotonic()
        taken = broker.held(second, first.bound + SLACK)
        elapsed = time.monotonic() - started
        _expect(taken > token, f"{broker.label}: the next holding has token {taken}, not more than {token}")
        _expect(elapsed > TTL * 0.5, f"{broker.label}: the lease was taken {elapsed:.1f}s after its holder's "
                                     f"last renewal, before its ttl of {TTL}s")
        _fenced_out(broker, first)


def _fenced_out(broker: _Broker, old: Lease) -> None:
    if isinstance(old, SendsOnce):
        queue = broker.queue()
        try:
            old.send_once(f"late-{uuid.uuid4().hex}", _publisher(queue, {"late": True}), keep=60)
        except (LeaseLost, *broker.connect().connection_errors):
            pass
        else:
            raise AssertionError(f"{broker.label}: a holder that lost the lease sent under it")
        _expect(broker.messages(queue) == [], f"{broker.label}: a refused send reached the queue")
        try:
            old.write_records({"late": "1"})
        except LeaseLost:
            pass
        else:
            raise AssertionError(f"{broker.label}: a holder that lost the lease wrote its records")
    _expect(not old.renew(), f"{broker.label}: the old holder's renew() says it still holds the lease")


def check_a_holder_cut_off_from_the_broker_is_fenced_out(transport: type[Transport], url: str, *,
                                                         settings: Settings | None = None) -> None:
    """A holder whose connection the network drops loses the lease within its bound; after the
    network is back, it cannot send under it."""
    with _broker(transport, url, settings, "cut") as broker, proxied(url) as through:
        if through is None:
            return  # a broker in a local file: no network to lose
        proxy, proxied_url = through
        first, second = broker.lease("first", proxied_url), broker.lease("second")
        token = broker.held(first, _free_wait(first))
        proxy.cut()
        taken = broker.held(second, first.bound + SLACK)
        _expect(taken > token, f"{broker.label}: the next holding has token {taken}, not more than {token}")
        proxy.restore()
        _fenced_out(broker, first)


def check_a_message_is_sent_once_per_key(transport: type[Transport], url: str, *,
                                         settings: Settings | None = None) -> None:
    """``send_once`` sends the one message published, with its record; the same key again sends
    nothing; a publish of no message is a ``ValueError``."""
    with _broker(transport, url, settings, "once") as broker:
        lease = broker.lease("sender")
        if not isinstance(lease, SendsOnce):
            return
        broker.held(lease, _free_wait(lease))
        queue = broker.queue()
        key, field = f"tick-{uuid.uuid4().hex}", f"entry-{uuid.uuid4().hex}"
        _expect(lease.send_once(key, _publisher(queue, {"n": 1}), record=(field, "1"), keep=60) is True,
                f"{broker.label}: send_once of a new key did not send")
        _expect(lease.send_once(key, _publisher(queue, {"n": 2}), record=(field, "2"), keep=60) is False,
                f"{broker.label}: send_once of a key sent already did not say so")
        _expect(lease.send_once(f"{key}-next", _publisher(queue, {"n": 3}), keep=60) is True,
                f"{broker.label}: send_once of another key did not send")
        records = lease.records()
        _expect(records is not None and records.get(field) == "1",
                f"{broker.label}: the lease's records hold {records!r}, without {field!r}: '1'")
        lease.write_records({field: None, f"{field}-x": "x"})
        records = lease.records() or {}
        _expect(field not in records and records.get(f"{field}-x") == "x",
                f"{broker.label}: write_records did not delete and set records ({records!r})")
        try:
            lease.send_once(f"{key}-none", lambda producer: None, keep=60)
        except ValueError:
            pass
        else:
            raise AssertionError(f"{broker.label}: send_once accepted a publish that sent nothing")
        # Read last: taking the messages waits for the queue to stay empty, which may outlast the
        # lease's ttl (the holder does not renew here); what the queue holds does not need the lease.
        received = broker.messages(queue)
        _expect(received == [{"n": 1}, {"n": 3}],
                f"{broker.label}: the queue received {received!r}, not the two messages sent once (and "
                f"nothing of the refused send_once)")


def check_record_tables_keep_records(transport: type[Transport], url: str, *,
                                     settings: Settings | None = None) -> None:
    """A record table (when the transport ``KeepsRecords``) writes, reads and deletes records,
    and its version changes with every change."""
    with _broker(transport, url, settings, "records") as broker:
        if not isinstance(broker.transport, KeepsRecords):
            return
        name = f"contract-{uuid.uuid4().hex}"
        table, other = broker.transport.record_table(name), broker.transport.record_table(name)
        try:
            _expect(isinstance(table, RecordTable), f"{broker.label}.record_table() is not a RecordTable")
            _expect(table.read() == {} and table.version() == 0,
                    f"{broker.label}: a new table holds {table.read()!r} at version {table.version()}")
            table.put("a", json.dumps({"x": 1}))
            table.put("b", "2")
            seen = other.version()
            _expect(other.read() == {"a": '{"x": 1}', "b": "2"},
                    f"{broker.label}: another reader sees {other.read()!r}")
            _expect(table.delete("a") and not table.delete("a"),
                    f"{broker.label}: delete() of a record did not say True once, then False")
            _expect(other.version() != seen and other.read() == {"b": "2"},
                    f"{broker.label}: after a delete the table reads {other.read()!r} at an unchanged "
                    f"version")
        finally:
            table.close()
            other.close()


CHECKS: tuple[Check, ...] = (
    check_leases_are_made_and_named,
    check_one_holder_at_a_time,
    check_a_release_hands_the_lease_over_at_once,
    check_renewing_keeps_the_lease,
    check_a_silent_holder_loses_the_lease_within_its_bound,
    check_a_holder_cut_off_from_the_broker_is_fenced_out,
    check_a_message_is_sent_once_per_key,
    check_record_tables_keep_records,
)


def check_name(check: Check) -> str:
    """A pytest id: the check's name without its ``check_`` prefix."""
    return check.__name__.removeprefix("check_")


def run_all(transport: type[Transport], url: str, *, settings: Settings | None = None,
            only: Iterable[str] | None = None) -> None:
    """Run every check (or those named in ``only``) against ``transport`` on the broker at ``url``;
    raise on the first failure, naming the transport and the check."""
    wanted = set(only) if only is not None else None
    for check in CHECKS:
        if wanted is not None and check_name(check) not in wanted:
            continue
        try:
            check(transport, url, settings=settings)
        except AssertionError as exc:
            raise AssertionError(f"{check_name(check)}: {exc}") from None

"""The kombu transport handed to ``kombu.Connection(transport=...)``: one command connection shared
by its channels, one ``LISTEN`` connection when it consumes, and the fetch loop.

**Waking.** Every message inserted (by this plugin, or by kombu's SQLAlchemy transport in a Celery
client) notifies ``"<schema>.<message table>"`` with its queue's id, from a trigger, at the commit
of the transaction that wrote it. A consuming transport listens on that channel: the queue
notified is marked, and the next turn of the loop fetches from it, as many messages as the
prefetch window has room for (at most ``fetch_limit``), in one statement. A queue stays marked
until a fetch with room comes back short, so nothing notified while the window was full is
missed. Every ``polling_interval`` seconds (1 by default) every queue is marked anyway: the one
poll, for a notification lost with a connection.

**Countdowns and ETAs** wait in the table (``not_before``): the notification of such a message
carries its due time, the loop wakes then and makes the due messages ready (the first consumer
to look does it for all), and they are fetched as any other; nothing is held in the worker for
them. Each poll also reads when the next one is due.

**Maintenance**, every ``polling_interval``, by every consuming worker: messages of lapsed
leases go back to their queues (a worker that died), those kombu consumed (it acknowledges on
receipt) and those expired are deleted, queues with ``x-expires`` consumed here are marked used,
and those nobody used for that long are deleted with their messages and bindings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from kombu.transport import virtual as _virtual

from worker_core.exceptions import TransportError
from worker_core.redaction import redact_url

from .channel import Channel
from .database import behind_pooler, connect, connection_errors
from .location import location_of
from .options import BrokerConfig
from .schema import LATEST, Names, migrate, versions
from .sql import Statements

__all__ = ["Transport"]

logger = logging.getLogger(__name__)

virtual: Any = _virtual

#: Each how many maintenance rounds the expired queues and counters are looked for.
QUEUE_EXPIRY_ROUNDS = 5
#: Whether this process said that it polls past a pooler (once is enough).
_said_polling = False


def _psycopg_errors() -> tuple[type[BaseException], ...]:
    try:
        return connection_errors()
    except ImportError:  # pragma: no cover - psycopg is a requirement
        return ()


class Transport(virtual.Transport):  # type: ignore[misc]
    """kombu's virtual transport on PostgreSQL: ``kombu.Connection(url, transport=Transport,
    transport_options={"postgres": BrokerConfig})``."""

    Channel = Channel
    #: kombu leaves the URL whole (libpq reads it: its query holds libpq's own parameters)
    can_parse_url = True
    default_port = 5432
    driver_type = "postgresql"
    driver_name = "psycopg"
    connection_errors = (*virtual.Transport.connection_errors, *_psycopg_errors())
    implements = virtual.Transport.implements.extend(
        asynchronous=True, exchange_type=frozenset({"direct", "topic", "fanout"}), heartbeats=False
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        config: BrokerConfig | None = client.transport_options.get("postgres")
        if config is None:
            raise TransportError(
                "this kombu transport is built by worker_transport_postgres.PostgresTransport "
                "(transport_options={'postgres': BrokerConfig}); use a postgresql:// URL"
            )
        self.config = config
        self.names = Names(config.schema, config.queue_table, config.message_table)
        self.sql = Statements(self.names)
        self.location = location_of(
            config.location(),
            config.conninfo,
            self.names,
            config.visibility_timeout,
            config.prepare_threshold,
        )
        super().__init__(client, **kwargs)
        self.polling_interval = config.polling_interval
        self._connect_timeout = client.connect_timeout
        self._db: Any = None
        self._committing = "on"
        self._listener: Any = None
        #: set once the connection was lost (``Connection.collect``): nothing is written any more
        self.lost = False
        #: queue id -> [(channel, queue name)] of the queues consumed here
        self._consumed: dict[int, list[tuple[Channel, str]]] = {}
        #: queue ids that may have ready messages
        self._marked: set[int] = set()
        self._poll_at = 0.0
        self._due_at: float | None = None
        self._maintain_at = 0.0
        self._rounds = 0
        self._hub: Any = None
        self._due_timer: Any = None

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        return uri if include_password else redact_url(uri)

    def driver_version(self) -> str:
        import psycopg

        return str(psycopg.__version__)

    # -- connections ----------------------------------------------------------------------------

    def db(self) -> Any:
        """The command connection of this kombu connection (shared by its channels)."""
        db = self._db
        if db is None or db.closed:
            if self.lost:
                raise TransportError(
                    "this PostgreSQL connection was lost; the worker reconnects on a new one"
                )
            db = self._db = connect(
                self.config.conninfo,
                role="broker",
                prepare_threshold=self.config.prepare_threshold,
                timeout=self._connect_timeout,
            )
            self._committing = "on"
            if self._consumed:
                self._commit_as_consumer(db)
        return db

    def _commit_as_consumer(self, db: Any) -> None:
        """Once this connection consumes: its takes, acknowledgements and requeues commit with
        ``consumer_synchronous_commit`` (``off`` by default: without waiting for the WAL flush,
        which a clean shutdown still makes; a crash or a failover to an asynchronous standby can
        then deliver again what was taken or acknowledged in its last moments, never lose a
        message). Connections that only publish keep the server's setting: a task sent is on
        disk before the send returns."""
        wanted = self.config.consumer_synchronous_commit
        if behind_pooler(self.config.conninfo):
            return  # (a session's setting would stay on a server connection other clients borrow)
        if self._committing != wanted:
            db.execute(f"SET synchronous_commit TO {wanted}")
            self._committing = wanted

    def ensure_tables(self) -> None:
        """Create or migrate the broker's tables on the first connection of this process (with
        ``migrate``), or check that they are there and current."""
        location = self.location
        if location.migrated:
            return
        db = self.db()
        if self.config.migrate:
            migrate(db, self.names, ("broker",))
        else:
            found = versions(db, self.names)["broker"]
            if found != LATEST["broker"]:
                raise TransportError(
                    f"the broker tables in schema {self.names.schema_name!r} are at version {found}, not "
                    f"{LATEST['broker']}, and migrate is off: run `workerctl postgres migrate` with this URL"
                )
        location.migrated = True

    def listens(self) -> bool:
        """Whether this transport waits on ``LISTEN``: with ``listen``, unless the broker URL leads
        to a pooler and no ``listen_url`` says where to listen (a pooler in transaction mode
        would lend the listening session to others: the worker polls instead)."""
        config = self.config
        if not config.listen:
            return False
        if config.listen_given or not behind_pooler(config.listen_conninfo):
            return True
        global _said_polling
        if not _said_polling:
            _said_polling = True
            logger.warning(
                "Not listening through the pooler at %s: looking at the queues every %gs "
                "(polling_interval); set listen_url to the server's own address to be woken at once",
                redact_url(config.conninfo),
                config.polling_interval,
            )
        return False

    def listener(self) -> Any:
        listener = self._listener
        if listener is None or listener.closed:
            listener = connect(
                self.config.listen_conninfo,
                role="listen",
                prepare_threshold=None,
                timeout=self._connect_timeout,
            )
            listener.execute(f'LISTEN "{self.names.message_channel}"')
            self._listener = listener
            self.mark_all()  # what was notified before it listened
        return listener

    def establish_connection(self) -> Any:
        self.db()
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        try:
            if self.location.unwritten and self._db is not None and not self._db.closed:
                try:
                    self.location.write(self._db)
                except self.connection_errors as exc:  # kept: the next connection writes them
                    logger.debug("could not write the acknowledgements before closing: %r", exc)
            super().close_connection(connection)
        finally:
            self._close_sockets()

    def _close_sockets(self) -> None:
        for attribute in ("_listener", "_db"):
            found = getattr(self, attribute)
            setattr(self, attribute, None)
            if found is not None:
                try:
                    found.close()
                except Exception:
                    pass

    def _collect(self, connection: Any) -> None:
        """kombu's ``Connection.collect`` (the worker's lost connection): close the channels
        without giving back the messages the worker holds. It keeps them, acknowledges them
        through its next connection, and their leases are renewed meanwhile; given back now, they
        would run twice."""
        self.lost = True
        for channel in list(self.channels):
            if channel._qos is not None:
                channel._qos.kept = True
            try:
                channel.close()
            except Exception as exc:
                logger.debug("error while closing a channel of the lost PostgreSQL connection: %r", exc)
        self._close_sockets()

    def enlisted_error(self, exc: BaseException) -> BaseException:
        """What to raise when writing on the application's connection failed (never retried)."""
        return TransportError(
            f"could not write the task on the application's connection ({type(exc).__name__}: "
            f"{str(exc).strip()}); it must reach the broker's database, where the tables of schema "
            f"{self.names.schema_name!r} are"
        )

    # -- what is consumed -----------------------------------------------------------------------

    def consuming_changed(self) -> None:
        consumed: dict[int, list[tuple[Channel, str]]] = {}
        for channel in self.channels:
            for queue in channel._active_queues:
                queue_id = channel.queue_ids.get(queue)
                if queue_id is not None:
                    consumed.setdefault(queue_id, []).append((channel, queue))
        self._consumed = consumed
        if consumed and self._db is not None and not self._db.closed:
            self._commit_as_consumer(self._db)
        self.mark_all()

    def mark_all(self) -> None:
        self._marked.update(self._consumed)
        self._due_at = time.monotonic()  # read when the next countdown is due

    def on_notify(self, payloads: Iterable[str]) -> None:
        for payload in payloads:
            queue, _, due = payload.partition("@")
            try:
                queue_id = int(queue)
            except ValueError:
                continue
            if queue_id not in self._consumed:
                continue
            if not due:
                self._marked.add(queue_id)
                continue
            try:
                at = time.monotonic() + (float(due) - time.time())
            except ValueError:
                continue
            self._set_due(at)

    def _set_due(self, at: float) -> None:
        if self._due_at is None or at < self._due_at:
            self._due_at = at
            if self._hub is not None:
                if self._due_timer is not None:
                    self._due_timer.cancel()
                self._due_timer = self._hub.call_later(max(0.0, at - time.monotonic()), self._on_due)

    # -- the loop -------------------------------------------------------------------------------

    def pump(self) -> bool:
        """One turn: write what waits to be written, look after the tables when due, make due
        countdowns ready, then fetch from the marked queues as the prefetch windows allow and
        deliver. Whether anything was delivered."""
        if self.lost:
            return False
        now = time.monotonic()
        if self.location.unwritten:
            self.location.write(self.db())
        if not self._consumed:
            return False
        if now >= self._poll_at:
            self._poll_at = now + self.polling_interval
            self._marked.update(self._consumed)
            if self._due_at is None or self._due_at > now:
                self._due_at = now
        if now >= self._maintain_at:
            self.maintain()
        if self._due_at is not None and now >= self._due_at:
            self.promote()
        return self.fetch() if self._marked else False

    def fetch(self) -> bool:
        delivered = False
        limit = self.config.fetch_limit
        for channel in list(self.channels):
            if channel.closed or not channel._active_queues:
                continue
            room = channel.qos.can_consume_max_estimate()
            room = limit if room is None else min(room, limit)
            queues = list(channel._active_queues)
            for queue in queues:
                if room <= 0:
                    break
                queue_id = channel.queue_ids.get(queue)
                if queue_id not in self._marked:
                    continue
                rows = channel.fetch(queue, room)
                if len(rows) < room:
                    self._marked.discard(queue_id)
                room -= len(rows)
                for row in rows:
                    envelope = channel.envelope(row, queue)
                    if not channel.taken_again(row, envelope, queue):
                        self._deliver(envelope, queue)
                delivered = delivered or bool(rows)
            if len(queues) > 1:  # the next turn starts with the next queue
                channel._active_queues[:] = [*queues[1:], queues[0]]
        return delivered

    def promote(self) -> None:
        """Make the due countdowns of the consumed queues ready; learn when the next is due."""
        queues = list(self._consumed)
        self._due_at = None
        row = self.db().execute(self.sql.promote, {"queues": queues}).fetchone()
        promoted, seconds = row
        if promoted:
            self._marked.update(promoted)
        if seconds is not None:
            self._set_due(time.monotonic() + max(0.0, float(seconds)))

    def maintain(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._maintain_at:
            return
        self._maintain_at = now + self.polling_interval
        self._rounds += 1
        db = self.db()
        with db.pipeline():
            reclaimed = db.execute(self.sql.reclaim)
            db.execute(self.sql.delete_consumed)
            expired = db.execute(self.sql.delete_expired)
            if self._consumed:
                db.execute(self.sql.touch_queues, (list(self._consumed),))
        if reclaimed.rowcount:
            logger.warning(
                "Restored %d message(s) whose lease lapsed (their worker died, or could not reach the "
                "database for longer than visibility_timeout=%gs)",
                reclaimed.rowcount,
                self.config.visibility_timeout,
            )
        if expired.rowcount:
            logger.info("Deleted %d expired message(s)", expired.rowcount)
        if self._rounds % QUEUE_EXPIRY_ROUNDS == 1:
            self._expire_queues(db)
            self._read_depths(db)

    def _read_depths(self, db: Any) -> None:
        names = sorted({queue for pairs in self._consumed.values() for _, queue in pairs})
        rows = db.execute(self.sql.depths, (names,)).fetchall() if names else []
        self.location.depths = {name: {"ready": int(ready), "delayed": int(delayed), "taken": int(taken)}
                                for name, ready, delayed, taken in rows}

    def _expire_queues(self, db: Any) -> None:
        db.execute(self.sql.forget_counters)
        for queue_id, name in db.execute(self.sql.expired_queues).fetchall():
            with db.transaction():
                db.execute(f"DELETE FROM {self.names.messages} WHERE queue_id = %s", (queue_id,))
                db.execute(f"DELETE FROM {self.names.bindings} WHERE queue = %s", (name,))
                db.execute(f"DELETE FROM {self.names.queues} WHERE id = %s", (queue_id,))
            logger.info("Deleted queue %r: unused for longer than its x-expires", name)

    def wait_time(self, now: float) -> float:
        wait = self._poll_at - now
        if self._due_at is not None:
            wait = min(wait, self._due_at - now)
        if self._marked and self._room():
            wait = 0.0
        return max(0.0, wait)

    def _room(self) -> bool:
        return any(
            channel._active_queues and channel.qos.can_consume()
            for channel in self.channels
            if not channel.closed
        )

    def listen(self, wait: float) -> None:
        """Wait at most ``wait`` seconds for a notification, and take every one that came."""
        if not self.listens():
            time.sleep(wait)  # polling only: the wait is the poll's interval
            return
        listener = self.listener()
        payloads = [note.payload for note in listener.notifies(timeout=wait, stop_after=1)]
        if payloads:
            payloads += [note.payload for note in listener.notifies(timeout=0)]
        self.on_notify(payloads)

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._consumed and self.listens():
            self.listener()
        while True:
            if self.pump():
                return
            now = time.monotonic()
            wait = self.wait_time(now) if self._consumed else self.polling_interval
            if deadline is not None:
                left = deadline - now
                if left <= 0:
                    raise TimeoutError()
                wait = min(wait, left)
            if self._consumed:
                self.listen(wait)
            else:
                time.sleep(wait)

    # -- kombu's hub (the async loop) -----------------------------------------------------------

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        self._hub = loop
        if self.listens():
            loop.add_reader(self.listener().fileno(), self._on_readable)
        loop.on_tick.add(self._on_tick)
        loop.call_repeatedly(self.polling_interval, self._on_poll)

    def _on_readable(self) -> None:
        listener = self._listener
        if listener is None or listener.closed:
            return
        self.on_notify([note.payload for note in listener.notifies(timeout=0)])
        self.pump()

    def _on_tick(self) -> None:
        if self.lost:
            return
        if self.location.unwritten or (self._marked and self._room()):
            self.pump()

    def _on_poll(self) -> None:
        self.pump()

    def _on_due(self) -> None:
        self._due_timer = None
        self.pump()

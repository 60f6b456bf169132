"""The embedded transport: a kombu virtual transport in a SQLite file, exercised through kombu with
real processes sharing the file."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kombu
import pytest
from kombu.pidbox import Mailbox
from workers import wait_for

from worker_core.app.settings import Settings
from worker_core.exceptions import ConfigurationError
from worker_core.transports.embedded import EmbeddedTransport
from worker_core.transports.embedded.store import QueueStore

# Run at the start of every helper process: a transport and a connection on the file in argv[1].
PRELUDE = """
import sys, time, kombu
from worker_core.app.settings import Settings
from worker_core.transports.embedded import EmbeddedTransport

transport = EmbeddedTransport(sys.argv[1], Settings())
connection = kombu.Connection(transport.url, transport=transport.kombu_transport(),
                              **transport.connection_options())
"""


def make_transport(path: Path, **options: Any) -> EmbeddedTransport:
    return EmbeddedTransport(f"embedded://{path}", Settings(broker_transport_options=options))


@pytest.fixture
def transport(tmp_path: Path) -> EmbeddedTransport:
    return make_transport(tmp_path / "broker.db")


@contextmanager
def connect(transport: EmbeddedTransport) -> Iterator[kombu.Connection]:
    connection = kombu.Connection(
        transport.url, transport=transport.kombu_transport(), **transport.connection_options()
    )
    try:
        yield connection
    finally:
        connection.release()


@contextmanager
def helper(transport: EmbeddedTransport, script: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """A Python process running ``script`` after the prelude; killed on the way out."""
    code = PRELUDE + textwrap.dedent(script)
    process = subprocess.Popen(
        [sys.executable, "-c", code, transport.url, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def run_helper(transport: EmbeddedTransport, script: str, *args: str) -> str:
    with helper(transport, script, *args) as process:
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        return out


def task_queue(name: str) -> kombu.Queue:
    return kombu.Queue(name, kombu.Exchange(name, type="direct"), routing_key=name)


def publish(connection: kombu.Connection, queue: kombu.Queue, *bodies: Any, **options: Any) -> None:
    producer = kombu.Producer(connection)
    for body in bodies:
        producer.publish(
            body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue], **options
        )


def consume(
    connection: kombu.Connection,
    queues: list[kombu.Queue],
    *,
    ack: bool = True,
    limit: int | None = None,
    prefetch: int | None = None,
    idle: float = 0.3,
) -> list[kombu.Message]:
    """Messages received until ``limit`` or until nothing comes for ``idle`` seconds."""
    received: list[kombu.Message] = []

    def on_message(body: Any, message: kombu.Message) -> None:
        received.append(message)
        if ack:
            message.ack()

    with kombu.Consumer(connection, queues, callbacks=[on_message], prefetch_count=prefetch):
        while limit is None or len(received) < limit:
            try:
                connection.drain_events(timeout=idle)
            except TimeoutError:
                break
    return received


def rows(transport: EmbeddedTransport) -> list[tuple[Any, ...]]:
    with sqlite3.connect(transport.path) as db:
        return db.execute("SELECT queue, tag, redelivered FROM messages ORDER BY id").fetchall()


# -- URLs and options ---------------------------------------------------------------------------


def test_bare_url_means_a_file_under_dot_worker_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    transport = EmbeddedTransport("embedded://", Settings())
    assert transport.path == str(tmp_path / ".worker" / "embedded.db")
    assert (tmp_path / ".worker").is_dir()


def test_url_path_is_absolute_with_three_slashes_and_relative_with_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert EmbeddedTransport(f"embedded://{tmp_path}/abs/q.db", Settings()).path == str(tmp_path / "abs/q.db")
    assert EmbeddedTransport("embedded://rel/dir/q.db", Settings()).path == str(tmp_path / "rel/dir/q.db")
    assert (tmp_path / "rel" / "dir").is_dir()


def test_package_exports_only_its_public_names() -> None:
    import worker_core.transports.embedded as embedded

    assert sorted(embedded.__all__) == ["EmbeddedTransport", "OPTIONS", "resolve_path"]


def test_info_names_the_file_and_the_options(transport: EmbeddedTransport) -> None:
    info = transport.info()
    assert (info["path"], info["visibility_timeout"], info["polling_interval"]) == (
        transport.path,
        3600.0,
        0.05,
    )


def test_results_default_to_the_brokers_own_file() -> None:
    assert EmbeddedTransport.default_result_backend("embedded:///x/q.db") == "embedded:///x/q.db"


@pytest.mark.parametrize("url", ["redis://localhost", "embedded:", "embedded:/x.db", "embedded://q.db?x=1"])
def test_url_that_is_not_an_embedded_file_url_is_refused_with_an_example(url: str) -> None:
    with pytest.raises(ConfigurationError, match="embedded:///") as caught:
        EmbeddedTransport(url, Settings())
    assert repr(url) in str(caught.value)


def test_url_naming_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a file"):
        EmbeddedTransport(f"embedded://{tmp_path}", Settings())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"visibility_timeout": "x"}, "'visibility_timeout' must be a number (got 'x' that is a str)"),
        ({"polling_interval": True}, "'polling_interval' must be a number (got True that is a bool)"),
        ({"polling_interval": 0}, "'polling_interval' must be greater than 0 (got 0)"),
        ({"visibilty_timeout": 10}, "Did you mean 'visibility_timeout'?"),
    ],
)
def test_bad_transport_options_are_refused(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make_transport(tmp_path / "q.db", **options)
    assert message in str(caught.value)


def test_kombus_reconnect_options_pass_through(tmp_path: Path) -> None:
    transport = make_transport(tmp_path / "q.db", interval_start=1, max_retries=3)
    options = transport.connection_options()["transport_options"]
    assert (options["interval_start"], options["max_retries"]) == (1, 3)


def test_connection_options_carry_the_resolved_path_and_options(tmp_path: Path) -> None:
    transport = make_transport(tmp_path / "q.db", visibility_timeout=60)
    assert transport.connection_options() == {
        "transport_options": {
            "path": str(tmp_path / "q.db"),
            "visibility_timeout": 60.0,
            "polling_interval": 0.05,
        }
    }


# -- publishing and consuming ---------------------------------------------------------------------


def test_message_published_through_kombu_is_consumed_and_deleted_on_ack(transport: EmbeddedTransport) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        publish(connection, queue, {"n": 1}, headers={"task": "add"})
        [message] = consume(connection, [queue])
        assert message.payload == {"n": 1}
        assert message.headers == {"task": "add"}
        assert message.delivery_info["redelivered"] is False
        assert transport.queue_depth(connection, "tasks") == 0
    assert rows(transport) == []


def test_simple_queue_round_trip(transport: EmbeddedTransport) -> None:
    with connect(transport) as connection, connection.SimpleQueue("simple") as queue:
        queue.put(
            b"\x00binary\xff", serializer=None, content_type="application/data", content_encoding="binary"
        )
        message = queue.get(timeout=1)
        assert message.body == b"\x00binary\xff"
        message.ack()


def test_message_published_by_another_process_reaches_this_consumer(transport: EmbeddedTransport) -> None:
    queue = task_queue("tasks")
    run_helper(
        transport,
        """
        queue = kombu.Queue("tasks", kombu.Exchange("tasks", type="direct"), routing_key="tasks")
        with connection:
            kombu.Producer(connection).publish({"from": "elsewhere"}, exchange=queue.exchange,
                                               routing_key="tasks", declare=[queue])
        """,
    )
    with connect(transport) as connection:
        assert [m.payload for m in consume(connection, [queue])] == [{"from": "elsewhere"}]


def test_queued_messages_survive_closing_and_reopening_connections(transport: EmbeddedTransport) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        publish(connection, queue, *range(5))
    with connect(transport) as connection:
        assert transport.queue_depth(connection, "tasks") == 5
        assert [m.payload for m in consume(connection, [queue])] == [0, 1, 2, 3, 4]


def test_empty_poll_does_not_spin_the_cpu(transport: EmbeddedTransport) -> None:
    queue = task_queue("idle")
    with connect(transport) as connection, kombu.Consumer(connection, [queue]):
        started = time.process_time()
        with pytest.raises(socket.timeout):
            connection.drain_events(timeout=0.5)
        assert time.process_time() - started < 0.2


# -- never losing a message -------------------------------------------------------------------------


def test_unacked_messages_are_restored_on_channel_close_and_logged_once_done(
    transport: EmbeddedTransport, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    queue = task_queue("tasks")
    with connect(transport) as connection:
        publish(connection, queue, "a", "b", "c")
        assert len(consume(connection, [queue], ack=False, limit=2)) == 2
        assert transport.queue_depth(connection, "tasks") == 1
    # Not kombu's "Restoring 2 ...", logged before it knows whether the restore works.
    assert caplog.messages == [f"Restored 2 unacknowledged message(s) to their queues in {transport.path}"]
    with connect(transport) as connection:
        received = consume(connection, [queue])
    assert [m.payload for m in received] == ["a", "b", "c"]
    assert [m.delivery_info["redelivered"] for m in received] == [True, True, False]
    assert received[0].headers["redelivered"] is True


def test_reject_with_requeue_puts_the_message_back_first_and_reject_without_deletes_it(
    transport: EmbeddedTransport,
) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        publish(connection, queue, "first", "second")
        [message] = consume(connection, [queue], ack=False, limit=1)
        message.reject(requeue=True)
        [again] = consume(connection, [queue], ack=False, limit=1)
        assert (again.payload, again.delivery_info["redelivered"]) == ("first", True)
        again.reject()
        assert [m.payload for m in consume(connection, [queue])] == ["second"]
    assert rows(transport) == []


def test_messages_reserved_by_a_killed_consumer_come_back_to_a_new_consumer(
    transport: EmbeddedTransport,
) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        publish(connection, queue, *range(4))
    with helper(
        transport,
        """
        queue = kombu.Queue("tasks", kombu.Exchange("tasks", type="direct"), routing_key="tasks")
        got = []
        with kombu.Consumer(connection, [queue], callbacks=[lambda body, message: got.append(body)],
                            prefetch_count=3):
            while len(got) < 3:
                connection.drain_events(timeout=5)
        print("holding", flush=True)
        time.sleep(60)  # holds the messages until the test kills it
        """,
    ) as process:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "holding"
        assert [tag is not None for _, tag, _ in rows(transport)] == [True, True, True, False]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    with connect(transport) as connection:
        received = consume(connection, [queue])
    assert [m.payload for m in received] == [0, 1, 2, 3]
    assert [m.delivery_info["redelivered"] for m in received] == [True, True, True, False]


def test_reservations_not_renewed_within_the_visibility_timeout_are_restored(tmp_path: Path) -> None:
    # The holder is alive on this host but stuck (it never polls again), so only the timeout applies.
    holder = make_transport(tmp_path / "q.db")
    impatient = make_transport(tmp_path / "q.db", visibility_timeout=0.5)
    queue = task_queue("tasks")
    with connect(holder) as connection:
        publish(connection, queue, "stuck")
    with helper(
        holder,
        """
        queue = kombu.Queue("tasks", kombu.Exchange("tasks", type="direct"), routing_key="tasks")
        got = []
        with kombu.Consumer(connection, [queue], callbacks=[lambda body, message: got.append(body)]):
            connection.drain_events(timeout=5)
            print("holding", flush=True)
            time.sleep(60)  # stuck: holds the message until the test kills it
        """,
    ) as process:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "holding"
        time.sleep(0.6)  # the behaviour under test: past the visibility timeout (0.5 s)
        with connect(impatient) as connection:
            [message] = consume(connection, [queue], limit=1, idle=2)
        assert (message.payload, message.delivery_info["redelivered"]) == ("stuck", True)


def test_two_consumer_processes_never_receive_the_same_message(transport: EmbeddedTransport) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        publish(connection, queue, *range(500))
    script = """
        queue = kombu.Queue("tasks", kombu.Exchange("tasks", type="direct"), routing_key="tasks")
        got = []
        def on_message(body, message):
            got.append(body)
            message.ack()
            time.sleep(0.002)  # one process alone needs a second: time for the other to join
        with kombu.Consumer(connection, [queue], callbacks=[on_message], prefetch_count=10):
            print("ready", flush=True)
            sys.stdin.readline()
            try:
                while True:
                    connection.drain_events(timeout=1)
            except TimeoutError:
                pass
        print(" ".join(map(str, got)))
        """
    with helper(transport, script) as first, helper(transport, script) as second:
        for process in (first, second):
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        for process in (first, second):  # start both at once
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [process.communicate(timeout=60) for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], [err for _, err in outputs]
    taken = [[int(n) for n in out.split()] for out, _ in outputs]
    assert all(taken), "each process should have received some messages"
    assert set(taken[0]).isdisjoint(taken[1])
    assert sorted(taken[0] + taken[1]) == list(range(500))


def test_prefetch_count_limits_unacked_deliveries(transport: EmbeddedTransport) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        publish(connection, queue, *range(5))
        held = consume(connection, [queue], ack=False, prefetch=2, idle=0.3)
        assert [m.payload for m in held] == [0, 1]
        held[0].ack()
        [third] = consume(connection, [queue], ack=False, prefetch=2, idle=0.3)
        assert third.payload == 2


def test_higher_priority_messages_are_delivered_first_and_in_order_within_a_priority(
    transport: EmbeddedTransport,
) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        producer = kombu.Producer(connection)
        for body, priority in [
            ("low-1", None),
            ("high", 9),
            ("mid-1", 5),
            ("low-2", 0),
            ("mid-2", 5),
            ("top", 42),
        ]:
            producer.publish(
                body, exchange=queue.exchange, routing_key="tasks", declare=[queue], priority=priority
            )
        received = [m.payload for m in consume(connection, [queue])]
    assert received == ["high", "top", "mid-1", "mid-2", "low-1", "low-2"]


def test_consumer_of_two_queues_takes_from_them_in_turn(transport: EmbeddedTransport) -> None:
    first, second = task_queue("first"), task_queue("second")
    with connect(transport) as connection:
        publish(connection, first, "a1", "a2", "a3")
        publish(connection, second, "b1", "b2", "b3")
        received = [m.payload for m in consume(connection, [first, second])]
    assert received == ["a1", "b1", "a2", "b2", "a3", "b3"]


def test_queue_depth_counts_ready_messages_only(transport: EmbeddedTransport) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        assert transport.queue_depth(connection, "tasks") == 0
        publish(connection, queue, 1, 2, 3)
        assert transport.queue_depth(connection, "tasks") == 3
        consume(connection, [queue], ack=False, limit=1)
        assert transport.queue_depth(connection, "tasks") == 2
        assert connection.default_channel.queue_purge("tasks") == 2
        assert transport.queue_depth(connection, "tasks") == 0


def test_expired_messages_are_not_delivered(transport: EmbeddedTransport) -> None:
    short = kombu.Queue("short", kombu.Exchange("short"), routing_key="short", message_ttl=0.2)
    with connect(transport) as connection:
        publish(connection, short, "queue-ttl")
        publish(connection, task_queue("tasks"), "own-ttl", expiration=0.2)
        publish(connection, task_queue("tasks"), "keeps")
        time.sleep(0.3)  # the behaviour under test: past the messages' time to live
        assert transport.queue_depth(connection, "short") == 0
        assert [m.payload for m in consume(connection, [short, task_queue("tasks")])] == ["keeps"]


def test_no_ack_consumer_takes_messages_out_of_the_file(transport: EmbeddedTransport) -> None:
    queue = task_queue("tasks")
    with connect(transport) as connection:
        publish(connection, queue, 1, 2)
        with kombu.Consumer(connection, [queue], no_ack=True, callbacks=[lambda body, message: None]):
            connection.drain_events(timeout=1)
        assert rows(transport) == [("tasks", None, 0)]
        message = connection.default_channel.basic_get("tasks", no_ack=True)
        assert message.payload == 2
    assert rows(transport) == []


def test_claim_is_the_same_without_update_returning(tmp_path: Path) -> None:
    store = QueueStore(str(tmp_path / "q.db"))
    store.use_returning = False
    for priority, payload in [(0, "a"), (3, "b")]:
        store.put("q", payload, priority, None)
    assert store.claim("q", "tag-1") == ("b", False)
    assert store.claim("q", "tag-2", remove=True) == ("a", False)
    assert store.claim("q", "tag-3") is None
    assert store.requeue(["tag-1"]) == 1
    assert store.claim("q", "tag-4") == ("b", True)
    store.close()


# -- exchanges across processes ---------------------------------------------------------------------


def test_fanout_message_from_another_process_reaches_every_bound_queue(transport: EmbeddedTransport) -> None:
    exchange = kombu.Exchange("broadcast", type="fanout")
    queues = [kombu.Queue(name, exchange) for name in ("left", "right")]
    with connect(transport) as connection:
        for queue in queues:
            queue(connection.default_channel).declare()
        run_helper(
            transport,
            """
            with connection:
                kombu.Producer(connection).publish("hello all", exchange="broadcast", routing_key="")
            """,
        )
        assert [m.payload for m in consume(connection, queues)] == ["hello all", "hello all"]


def test_direct_exchange_routes_by_key_to_queues_bound_in_another_process(
    transport: EmbeddedTransport,
) -> None:
    exchange = kombu.Exchange("jobs", type="direct")
    run_helper(
        transport,
        """
        with connection:
            exchange = kombu.Exchange("jobs", type="direct")
            for key in ("red", "blue"):
                kombu.Queue(key, exchange, routing_key=key)(connection.default_channel).declare()
        """,
    )
    with connect(transport) as connection:
        kombu.Producer(connection).publish("for blue", exchange="jobs", routing_key="blue")
        red, blue = (kombu.Queue(key, exchange, routing_key=key) for key in ("red", "blue"))
        assert [m.payload for m in consume(connection, [red, blue])] == ["for blue"]


def test_remote_control_broadcast_gets_a_reply_from_every_node(transport: EmbeddedTransport) -> None:
    node_script = """
        from kombu.pidbox import Mailbox
        mailbox = Mailbox("test", type="fanout")(connection)
        handlers = {"ping": lambda state: "pong"}
        node = mailbox.Node(sys.argv[2], channel=connection.default_channel, handlers=handlers)
        node.listen()
        print("listening", flush=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=0.5)
            except TimeoutError:
                pass
        """
    with helper(transport, node_script, "node-1") as one, helper(transport, node_script, "node-2") as two:
        for process in (one, two):
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "listening"
        with connect(transport) as connection:
            replies = Mailbox("test", type="fanout")(connection).multi_call("ping", timeout=5, limit=2)
    assert sorted(replies, key=str) == [{"node-1": "pong"}, {"node-2": "pong"}]
    with sqlite3.connect(transport.path) as db:
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)


def test_closing_a_consumer_deletes_its_auto_delete_broadcast_queue(transport: EmbeddedTransport) -> None:
    exchange = kombu.Exchange("events", type="fanout")
    queue = kombu.Queue("mine", exchange, auto_delete=True)
    with connect(transport) as connection, kombu.Consumer(connection, [queue]):
        assert connection.default_channel.get_table("events") == [("", "", "mine")]
    with connect(transport) as connection:
        assert connection.default_channel.get_table("events") == []
        assert os.path.exists(transport.path)


def test_a_fork_waits_while_another_thread_is_inside_the_database(tmp_path: Path) -> None:
    import threading

    from worker_core.transports.embedded.database import Database

    database = Database(str(tmp_path / "fork.db"), lambda connection: None)
    inside, leave, forked = threading.Event(), threading.Event(), threading.Event()
    children: list[int] = []

    def hold_the_connection() -> None:  # as the consumer's thread polling the queue does
        with database.locked() as connection:
            connection.execute("SELECT 1")
            inside.set()
            leave.wait(10)

    def fork() -> None:  # as the prefork pool's driver thread growing the pool does
        pid = os.fork()
        if pid == 0:
            try:
                with database.locked() as connection:  # the child's first SQLite call
                    connection.execute("SELECT 1")
            finally:
                os._exit(0)
        children.append(pid)
        forked.set()

    holder = threading.Thread(target=hold_the_connection)
    holder.start()
    assert inside.wait(5)
    forker = threading.Thread(target=fork)
    forker.start()
    try:
        assert not forked.wait(0.3)  # the fork waits for the thread inside SQLite
    finally:
        leave.set()
        holder.join(5)
        forker.join(5)
    assert forked.is_set()
    [pid] = children

    def reaped() -> tuple[int, int] | None:
        found, status = os.waitpid(pid, os.WNOHANG)
        return (found, status) if found else None

    try:
        _, status = wait_for(reaped, 10, interval=0.01, message="the child to exit (it blocked in its first "
                                                              "SQLite call?)")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    assert os.waitstatus_to_exitcode(status) == 0
    with database.locked() as connection:  # the parent's connection is still usable
        assert connection.execute("SELECT 2").fetchone() == (2,)

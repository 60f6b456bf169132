"""The transports' fast paths lean on private names of kombu, py-amqp and redis-py; each is
checked before first use. Here every check meets a library that changed what it looks at (a
method that takes other arguments and no longer uses the attributes the fast path relies on, a
version outside the range checked): its fast path, and those that work only with it, turn off,
one log line says what changed, and messages flow through the libraries' own paths against the
real brokers (kombu consumers, then real workers): acknowledged, priorities kept, nothing left.
"""

from __future__ import annotations

import configparser
import inspect
import json
import logging
import re
import struct
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import kombu
import pytest
import redis
from conftest import AMQP_TEST_URL, REDIS_PORT, REPO, empty_redis, redis_db, require_server
from envelopes import RawMessage
from kombu.asynchronous import Hub
from workers import TESTS, WorkerProcess, wait_for

from worker_core.app.broker import task_queue
from worker_core.app.settings import Settings
from worker_core.exceptions import ConfigurationError
from worker_core.fastpaths import STOCK_VARIABLE, Check, decide
from worker_transport_amqp import AmqpTransport
from worker_transport_amqp import internals as amqp_internals
from worker_transport_redis import RedisBackend, RedisTransport
from worker_transport_redis import internals as redis_internals
from worker_transport_redis.stock import priority_lists

DB = 14  # this file's database on the shared Redis
URL = redis_db(DB)
INTERNALS = {"redis": redis_internals, "amqp": amqp_internals}


def changed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` as a newer library might have it: the same behaviour, behind another
    signature, and none of the attribute names its code used."""
    def changed(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    return changed


def change(patch: pytest.MonkeyPatch, check: Check) -> None:
    """Make ``check``'s library change what the check looks at."""
    patch.setattr(check.owner, check.name, changed(getattr(check.owner, check.name)))


def went_off(transport: str, key: str) -> set[str]:
    """``key`` and every fast path that works only with it."""
    paths = INTERNALS[transport].PATHS
    off = {key}
    for name, path in paths.items():  # in order of their needs
        if set(path.needs) & off:
            off.add(name)
    return off


@pytest.fixture
def library() -> Iterator[pytest.MonkeyPatch]:
    """Changes to the libraries, undone afterwards; the fast paths are decided again before and
    after (so the tests that follow see the libraries as they are)."""
    for internals in INTERNALS.values():
        internals.forget()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(STOCK_VARIABLE, raising=False)
        yield patch
    for internals in INTERNALS.values():
        internals.forget()


def _checks() -> list[Any]:
    """Every check of every fast path, one for each name (a name's checks fail together)."""
    found: dict[tuple[str, str, int, str], Any] = {}
    for transport, internals in INTERNALS.items():
        for key, path in internals.PATHS.items():
            for check in path.checks:
                owner = getattr(check.owner, "__qualname__", None) or check.owner.__name__
                found.setdefault((transport, key, id(check.owner), check.name), pytest.param(
                    transport, key, check, id=f"{transport}-{key}-{owner}.{check.name}"))
    return list(found.values())


CHECKS = _checks()


# -- the checks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("transport", "key", "check"), CHECKS)
def test_each_check_turns_its_fast_path_off_when_the_library_changes_what_it_relies_on(
        library: pytest.MonkeyPatch, transport: str, key: str, check: Check) -> None:
    internals = INTERNALS[transport]
    assert check() is None  # the installed libraries are the ones checked
    change(library, check)
    decision = decide(internals.PATHS, {})
    off = {name for name in internals.PATHS if name not in decision}
    assert went_off(transport, key) <= off
    assert check.name in decision.off[key]  # the line names what changed, and in which version
    library_name = check.owner.__module__.partition(".")[0] if isinstance(check.owner, type) else \
        check.owner.__name__.partition(".")[0]
    assert f"{library_name} {sys.modules[library_name].__version__}'s" in decision.off[key]


@pytest.mark.parametrize(("module", "version"), [(kombu, "5.8.0"), (kombu, "5.6.2"), (amqp, "5.5.0"),
                                                 (amqp, "5.4.1"), (redis, "8.2.0"), (redis, "6.0.0")])
def test_a_library_version_outside_the_range_checked_turns_its_fast_paths_off(
        library: pytest.MonkeyPatch, module: Any, version: str) -> None:
    library.setattr(module, "__version__", version)
    for internals in INTERNALS.values():
        decision = decide(internals.PATHS, {})
        for key, path in internals.PATHS.items():
            depends = any(each.module is module for each in path.libraries)
            if depends:
                assert key not in decision
                assert f"{module.__name__} {version} is not among the versions checked" in decision.off[key]


def test_worker_stock_kombu_turns_every_fast_path_off_and_0_leaves_them_on() -> None:
    for internals in INTERNALS.values():
        assert not decide(internals.PATHS, {STOCK_VARIABLE: "1"}).on
        assert decide(internals.PATHS, {STOCK_VARIABLE: "0"}).on == frozenset(internals.PATHS)


def test_the_pins_are_the_versions_the_checks_accept() -> None:
    def requirements(folder: str) -> dict[str, str]:
        config = configparser.ConfigParser()
        config.read(REPO / folder / "setup.cfg")
        lines = [line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()]
        return {line.split(">")[0].split("[")[0]: line.replace("[redis]", "") for line in lines}

    for folder in ("core", "plugins/transport_redis", "plugins/transport_amqp"):
        assert requirements(folder)["kombu"] == redis_internals.KOMBU.checked()
    assert amqp_internals.KOMBU.checked() == redis_internals.KOMBU.checked()
    assert requirements("plugins/transport_redis")["redis"] == redis_internals.REDIS.checked()
    assert requirements("plugins/transport_amqp")["amqp"] == amqp_internals.AMQP.checked()


def test_tls_arguments_py_amqp_no_longer_takes_stop_the_connection_with_a_clear_error(
        library: pytest.MonkeyPatch) -> None:
    from amqp.transport import SSLTransport

    def _wrap_socket_sni(self: Any, sock: Any, keyfile: Any = None, certfile: Any = None,
                         cert_reqs: Any = None, ca_certs: Any = None) -> Any:
        raise AssertionError("never reached")

    library.setattr(SSLTransport, "_wrap_socket_sni", _wrap_socket_sni)
    transport = AmqpTransport("amqps://guest:guest@127.0.0.1:5671//", Settings())
    connection = kombu.Connection(transport.url, transport=transport.kombu_transport(),
                                  **transport.connection_options())
    with pytest.raises(ConfigurationError, match=r"py-amqp 5\.\d+\.\d+ no longer takes the SSL argument\(s\) "
                                                 r"'server_hostname' \(checked: amqp>=5\.4\.2,<5\.5\)"):
        connection.transport  # noqa: B018 (kombu builds the transport here)


# -- Redis: kombu consumers through what is left --------------------------------------------------


class RedisRun:
    """Messages through the Redis transport as the fast paths on in this process allow."""

    def __init__(self) -> None:
        self.prefix = f"fb-{uuid.uuid4().hex[:12]}:"
        self.raw = redis.Redis.from_url(URL)
        self.transport = RedisTransport(URL, Settings(
            broker_transport_options={"global_keyprefix": self.prefix}))

    def connect(self) -> kombu.Connection:
        return kombu.Connection(URL, transport=self.transport.kombu_transport(),
                                **self.transport.connection_options())

    def round_trip(self) -> dict[str, Any]:
        """Priorities, a malformed envelope and acknowledgements, on a kombu hub; what was used."""
        queue = task_queue(f"q-{uuid.uuid4().hex[:8]}", Settings())
        got: list[int] = []
        refused: list[str] = []
        with self.connect() as connection:
            producer = kombu.Producer(connection.default_channel)
            for number, priority in enumerate((9, 0, 6, 3, 9, 0)):
                producer.publish({"n": number, "p": priority}, exchange="", routing_key=queue.name,
                                 declare=[queue], priority=priority)
            self.raw.lpush(self.prefix + queue.name, b"not json at all", json.dumps(
                {"body": None, "headers": {}, "content-type": None, "content-encoding": None,
                 "properties": {"delivery_tag": str(uuid.uuid4()), "delivery_info": ""}}))
            consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=False,
                                      on_message=lambda message: (got.append(message.payload["p"]),
                                                                  message.ack()))
            consumer.on_decode_error = lambda message, exc: (refused.append(str(exc)), message.reject())
            consumer.qos(prefetch_count=10, apply_global=True)
            consumer.consume()
            hub = Hub()
            connection.transport.register_with_event_loop(connection.connection, hub)
            hub.call_repeatedly(0.02, lambda: None)
            turns = hub.create_loop()

            def turned() -> bool:
                if len(got) < 6 or len(refused) < 2:
                    next(turns)
                return len(got) >= 6 and len(refused) >= 2

            wait_for(turned, 10, interval=0,
                     message=lambda: f"six messages and two refusals (got {got}, refused {refused})")
            ticks = {getattr(tick, "__module__", "") for tick in hub.on_tick}
            channel = type(connection.default_channel)
            hub.close()
        wait_for(lambda: self.unacked() == 0, 5, message="the acknowledgements to be written")
        lists = priority_lists(queue.name, [0, 3, 6, 9], "\x06\x16")
        left = sum(self.raw.llen(self.prefix + name) for name in lists)
        return {"got": got, "refused": refused, "channel": channel, "ticks": ticks, "left": left}

    def unacked(self) -> int:
        return int(self.raw.hlen(self.prefix + "unacked"))

    def close(self) -> None:
        keys = list(self.raw.scan_iter(match=self.prefix + "*", count=1000))
        if keys:
            self.raw.delete(*keys)
        self.raw.close()


@pytest.fixture
def redis_run() -> Iterator[RedisRun]:
    require_server(REDIS_PORT, "Redis")
    run = RedisRun()
    yield run
    run.close()


def said(caplog: pytest.LogCaptureFixture, logger: str) -> str:
    """What ``logger`` said: one line per reason a fast path is off, none of them twice."""
    lines = [record.getMessage() for record in caplog.records if record.name == logger]
    assert lines and len(set(lines)) == len(lines), lines
    return "\n".join(lines)


REDIS_CHECKS = [each for each in CHECKS if each.values[0] == "redis"]


@pytest.mark.parametrize(("transport", "key", "check"), REDIS_CHECKS)
def test_a_kombu_consumer_on_redis_gets_every_message_through_what_is_left_when_a_check_fails(
        library: pytest.MonkeyPatch, redis_run: RedisRun, caplog: pytest.LogCaptureFixture, transport: str,
        key: str, check: Check) -> None:
    from worker_transport_redis.acking import AckingChannel
    from worker_transport_redis.channel import Channel
    from worker_transport_redis.stock import StockChannel

    change(library, check)
    with caplog.at_level(logging.INFO, logger="worker_transport_redis.internals"):
        ran = redis_run.round_trip()
        redis_run.round_trip()  # a second connection: the line is not given again
        if "listener" not in redis_internals.current():
            wait_for_a_result_through_get_message()
    line = said(caplog, "worker_transport_redis.internals")
    off = set(redis_internals.PATHS) - redis_internals.current().on
    assert went_off("redis", key) <= off
    assert check.name in line and "still" in line
    assert all(redis_internals.PATHS[name].name in line for name in off)
    assert ran["got"] == [0, 0, 3, 6, 9, 9]
    assert len(ran["refused"]) == 2
    assert any("its envelope is not JSON" in reason for reason in ran["refused"])
    assert any("its 'delivery_info' must be an object" in reason for reason in ran["refused"])
    assert ran["left"] == 0
    expected = StockChannel if "acks" in off else AckingChannel if "fetch" in off else Channel
    assert ran["channel"] is expected
    assert ("worker_transport_redis.kombu_transport" in ran["ticks"]) is ("hub" not in off)
    assert ("kombu.transport.redis" in ran["ticks"]) is ("hub" in off)


def wait_for_a_result_through_get_message() -> None:
    """A result stored while a client waits on the Redis backend reaches it."""
    backend = RedisBackend(URL, Settings())
    task_id = str(uuid.uuid4())
    store = threading.Timer(0.2, backend.store_result, (task_id, 42, "SUCCESS"))
    store.start()
    try:
        assert backend._current().listener._selects is False
        assert backend.wait_for(task_id, timeout=5)["result"] == 42
    finally:
        store.join()
        backend.forget(task_id)
        backend.close()


# -- AMQP: kombu consumers through what is left ---------------------------------------------------


def amqp_round_trip() -> dict[str, Any]:
    """Messages with headers of every kind, one whose properties cannot be decoded, priorities,
    acknowledgements, on a kombu hub; what was used."""
    from test_amqp_transport import Turns, connect

    name = f"fb-{uuid.uuid4().hex[:10]}"
    queue = task_queue(name, Settings(task_queue_max_priority=10))
    headers = {"task": "proj.add", "ratio": 0.25, "big": 2**40, "nested": {"list": [1, "two", None]}}
    got: list[Any] = []
    refused: list[str] = []
    seen: dict[str, Any] = {}
    with connect() as connection:
        channel = connection.default_channel
        queue(channel).declare()
        # not UTF-8, which RabbitMQ passes through: content_type b"\xff\xfe"
        channel.basic_publish(RawMessage(b"{}", struct.pack(">HB", 0x8000, 2) + b"\xff\xfe"), exchange="",
                              routing_key=name)
        producer = kombu.Producer(channel)
        for number, priority in enumerate((0, 9, 3, 6)):
            producer.publish({"n": number}, exchange="", routing_key=name, priority=priority, headers=headers)
        consumer = kombu.Consumer(channel, [queue], no_ack=False,
                                  on_message=lambda message: (got.append((message.payload, message.headers)),
                                                              message.ack()))
        consumer.on_decode_error = lambda message, exc: (refused.append(str(exc)),
                                                         message.reject(requeue=False))
        consumer.qos(prefetch_count=10, apply_global=True)
        consumer.consume()
        turns = Turns(connection)
        try:
            turns.until(lambda: len(got) == 4 and len(refused) == 1, timeout=10)
        finally:
            turns.close()
        seen.update(channel=type(channel), transport=type(connection.connection.transport),
                    handler=type(connection.connection.on_inbound_frame),
                    whole=getattr(connection.connection, "takes_whole_deliveries", False))
    with connect() as connection:
        channel = connection.channel()
        seen["left"] = channel.queue_declare(name, passive=True).message_count
        channel.queue_delete(name)
        channel.exchange_delete(name)
        channel.close()
    seen.update(got=got, refused=refused)
    return seen


AMQP_CHECKS = [each for each in CHECKS if each.values[0] == "amqp"]


@pytest.mark.parametrize(("transport", "key", "check"), AMQP_CHECKS)
def test_a_kombu_consumer_on_rabbitmq_gets_every_message_through_what_is_left_when_a_check_fails(
        library: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, transport: str, key: str,
        check: Check) -> None:
    require_server(5672, "RabbitMQ")
    from amqp.transport import TCPTransport

    from worker_transport_amqp.channel import Channel, DeliveringChannel
    from worker_transport_amqp.decoding import FrameHandler
    from worker_transport_amqp.reading import BufferedTCPTransport
    from worker_transport_amqp.stock import StockChannel

    change(library, check)
    with caplog.at_level(logging.INFO, logger="worker_transport_amqp.internals"):
        ran = amqp_round_trip()
    line = said(caplog, "worker_transport_amqp.internals")
    off = set(amqp_internals.PATHS) - amqp_internals.current().on
    assert went_off("amqp", key) <= off
    assert check.name in line and "delivery still works, more slowly" in line
    assert sorted(payload["n"] for payload, _ in ran["got"]) == [0, 1, 2, 3]
    assert [payload["n"] for payload, _ in ran["got"]][:1] == [1]  # priority 9 first
    assert all(headers["ratio"] == 0.25 and headers["nested"] == {"list": [1, "two", None]}
               for _, headers in ran["got"])
    assert len(ran["refused"]) == 1 and "its properties cannot be decoded" in ran["refused"][0]
    assert ran["left"] == 0
    expected = (StockChannel if {"acks", "delivery"} <= off else DeliveringChannel if "acks" in off
                else Channel)
    assert ran["channel"] is expected
    assert ran["transport"] is (TCPTransport if "reader" in off else BufferedTCPTransport)
    assert (ran["handler"] is FrameHandler) is ("delivery" not in off)
    assert ran["whole"] is ("whole" not in off)


def test_without_the_rarer_types_reader_a_header_holding_one_is_decoded_by_py_amqp(
        library: pytest.MonkeyPatch) -> None:
    from amqp.serialization import decode_properties_basic

    from worker_transport_amqp.decoding import decode_basic_properties

    raw = bytes(amqp.basic_message.Message(b"", application_headers={"ratio": 0.25, "task": "t"})
                ._serialize_properties())
    reads: list[int] = []
    original = amqp.serialization._read_item

    def counting(buf: bytes, offset: int) -> Any:
        reads.append(offset)
        return original(buf, offset)

    library.setattr(amqp.serialization, "_read_item", counting)
    assert decode_basic_properties(raw, 0) == decode_properties_basic(raw, 0)
    assert reads  # the float went through py-amqp's item reader
    library.setattr(amqp.serialization, "_read_item", changed(original))
    amqp_internals.forget()
    reads.clear()
    assert decode_basic_properties(raw, 0) == decode_properties_basic(raw, 0)
    assert not reads and "decoder" not in amqp_internals.current()


# -- real workers ----------------------------------------------------------------------------------

#: ``workerctl`` after changing the library as ``FALLBACK_CHANGE`` says: "module:Owner.name"
#: (another signature, the same behaviour) or "module:__version__=X.Y.Z"
CHANGING_WORKER = """
import importlib, os, sys
module, _, change = os.environ["FALLBACK_CHANGE"].partition(":")
target = importlib.import_module(module)
if change.startswith("__version__="):
    target.__version__ = change.partition("=")[2]
else:
    owner_name, _, name = change.rpartition(".")
    owner = getattr(target, owner_name)
    original = getattr(owner, name)
    def changed(*args, **kwargs):
        return original(*args, **kwargs)
    setattr(owner, name, changed)
sys.argv[0] = "workerctl"
from worker_core.cli import run
run()
"""


class ChangingWorker(WorkerProcess):
    program = ("-c", CHANGING_WORKER, "worker")


@pytest.fixture
def results() -> str:
    """This file's Redis database, emptied, as the result backend."""
    return empty_redis(URL)


def run_tasks(broker: str, backend: str, queue: str, count: int = 20) -> list[Any]:
    from apps import basic

    basic.app.conf.update(broker_url=broker, result_backend=backend)
    try:
        sent = [basic.add.apply_async((number, number), queue=queue) for number in range(count)]
        return [result.get(timeout=20) for result in sent]
    finally:
        basic.app.close()


@pytest.mark.parametrize(("broker", "change", "expected"), [
    (URL, "kombu.transport.redis:Channel._brpop_read", "Redis transport: the batched fetch is off, because "
     "kombu {kombu}'s Channel._brpop_read takes (*args, **kwargs), not (self, **options)"),
    (URL, "kombu:__version__=5.8.0", "Redis transport: the acknowledgement batching, the batched fetch and "
     "the hub registration of each socket once are off, because kombu 5.8.0 is not among the versions "
     "checked (kombu>=5.7,<5.8)"),
    (AMQP_TEST_URL, "amqp:__version__=5.5.0", "AMQP transport: the buffered reader, direct delivery, the "
     "header decoder's reading of rarer types, taking whole deliveries from the read buffer and the "
     "acknowledgement batching are off, because amqp 5.5.0 is not among the versions checked"),
    (AMQP_TEST_URL, "amqp:Channel._on_basic_deliver", "AMQP transport: the acknowledgement batching is off, "
     "because amqp {amqp}'s Channel._on_basic_deliver takes (*args, **kwargs)"),
], ids=["redis-brpop-read", "redis-kombu-version", "amqp-version", "amqp-on-basic-deliver"])
def test_a_worker_whose_library_changed_says_so_once_and_runs_its_tasks(
        tmp_path: Path, results: str, broker: str, change: str, expected: str) -> None:
    if broker.startswith("amqp"):
        require_server(5672, "RabbitMQ")
    queue = f"fb-{uuid.uuid4().hex[:10]}"
    env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(TESTS), "WORKER_BROKER_URL": broker,
           "WORKER_RESULT_BACKEND": results, "FALLBACK_CHANGE": change}
    worker = ChangingWorker(["-A", "apps.basic", "-P", "solo", "-l", "INFO", "-Q", queue,
                             "-n", f"fb-{uuid.uuid4().hex[:8]}@localhost"],
                            {**_environment(), **env}, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        assert run_tasks(broker, results, queue) == [2 * number for number in range(20)]
        assert worker.stop() == 0
        log = worker.log()
        assert log.count(expected.format(kombu=kombu.__version__, amqp=amqp.__version__)) == 1, log[-3000:]
        assert "Traceback" not in log
    finally:
        worker.kill()
        _delete_amqp_queue(broker, queue)


@pytest.mark.parametrize("broker", [URL, AMQP_TEST_URL], ids=["redis", "amqp"])
def test_a_worker_with_worker_stock_kombu_says_so_once_and_runs_its_tasks(
        tmp_path: Path, results: str, broker: str) -> None:
    if broker.startswith("amqp"):
        require_server(5672, "RabbitMQ")
    queue = f"fb-{uuid.uuid4().hex[:10]}"
    env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(TESTS), "WORKER_BROKER_URL": broker,
           "WORKER_RESULT_BACKEND": results, STOCK_VARIABLE: "1"}
    worker = WorkerProcess(["-A", "apps.basic", "-P", "solo", "-l", "INFO", "-Q", queue,
                            "-n", f"fb-{uuid.uuid4().hex[:8]}@localhost"], {**_environment(), **env},
                           tmp_path / "worker.log")
    try:
        worker.wait_ready()
        assert run_tasks(broker, results, queue) == [2 * number for number in range(20)]
        assert worker.stop() == 0
        log = worker.log()
        which = "Redis transport" if broker.startswith("redis") else "AMQP transport"
        assert log.count(f"{which}: {STOCK_VARIABLE}=1: every fast path is off") == 1, log[-3000:]
        assert "is off, because" not in log and "Traceback" not in log
    finally:
        worker.kill()
        _delete_amqp_queue(broker, queue)


def _environment() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if name != STOCK_VARIABLE}


def _delete_amqp_queue(broker: str, queue: str) -> None:
    if not broker.startswith("amqp"):
        return
    with kombu.Connection(broker) as connection:
        channel = connection.channel()
        channel.queue_delete(queue)
        channel.exchange_delete(queue)
        channel.close()


#: the library names each plugin reaches, found by reading both libraries' code and the plugins'
PRIVATE = {"redis": ["_brpop_start", "_brpop_read", "_in_poll", "_brpop_sent_at", "_queue_cycle",
                     "_flush_brpop_reauth", "_deliver", "_do_restore_message", "_chan_to_sock",
                     "_paused_brpop", "_sock", "_remove_from_indices", "_consumers", "_channels",
                     "_create_client", "_raw", "_size", "_q_for_pri", "_closing", "_delivered",
                     "_fd_to_chan"],
           "amqp": ["_setup_transport", "_quick_recv", "_read_buffer", "_read_item", "_pending",
                    "_on_basic_deliver", "_wrap_socket_sni"]}


@pytest.mark.parametrize("transport", ["redis", "amqp"])
def test_only_the_internals_module_reaches_the_libraries_private_names_and_lists_each(transport: str) -> None:
    internals = INTERNALS[transport]
    package = Path(inspect.getfile(internals)).parent
    names = "|".join(PRIVATE[transport])
    pattern = re.compile(rf"\.({names})\b|def ({names})\(")
    for module in sorted(package.glob("*.py")):
        if module.name != "internals.py":
            used = {match.group(1) or match.group(2) for match in pattern.finditer(module.read_text())}
            assert not used, f"{module.name} reaches {sorted(used)} outside internals"
    source = Path(inspect.getfile(internals)).read_text()
    body = source.replace(internals.__doc__ or "", "")
    reached = {match.group(1) or match.group(2) for match in pattern.finditer(body)}
    assert reached, "the internals module reaches the names it exists for"
    unlisted = sorted(name for name in reached if name not in (internals.__doc__ or ""))
    assert not unlisted, f"the docstring of {transport}'s internals does not list {unlisted}"

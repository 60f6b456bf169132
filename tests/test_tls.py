"""TLS to the brokers and the result backend: verified by default, refused at start when nothing
says how to verify, turned off only in so many words (with a warning), against a redis-server
and a RabbitMQ node this module starts with certificates it makes."""

from __future__ import annotations

import json
import logging
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import kombu
import pytest
from certs import make_authority
from tls_servers import RabbitTlsNode, RedisTlsServer

from worker_core import App
from worker_core.app.settings import Settings
from worker_core.exceptions import ConfigurationError
from worker_core.redaction import MASK, redact_value
from worker_transport_amqp import AmqpTransport
from worker_transport_redis import RedisBackend, RedisTransport

# -- certificates and servers ---------------------------------------------------------------------


@attrs.frozen
class Pki:
    """The CA the servers' certificate comes from, and a CA that signed nothing of theirs."""

    ca: Path
    stranger: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    trusted = make_authority(directory, "trusted")
    stranger = make_authority(directory, "stranger")
    # issued for "localhost" only: reaching the same server as 127.0.0.1 is "another host name"
    server = trusted.issue("localhost", hosts=("localhost",))
    return Pki(ca=trusted.cert, stranger=stranger.cert, cert=server.cert, key=server.key)


@pytest.fixture(scope="module")
def redis_tls(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisTlsServer]:
    server = RedisTlsServer(tmp_path_factory.mktemp("redis-tls"), pki.cert, pki.key, pki.ca)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def rabbit_tls(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitTlsNode]:
    node = RabbitTlsNode(tmp_path_factory.mktemp("rabbit-tls"), pki.cert, pki.key, pki.ca)
    try:
        yield node.start()
    finally:
        node.stop()


def rediss(server: RedisTlsServer, db: int, *, host: str = "localhost", **query: str) -> str:
    tail = "&".join(f"{name}={value}" for name, value in query.items())
    return f"rediss://{host}:{server.port}/{db}" + (f"?{tail}" if tail else "")


def verified_backend(server: RedisTlsServer, pki: Pki) -> dict[str, Any]:
    """A result backend on the TLS server, verified, as the worker and a client configure it."""
    return {"result_backend": rediss(server, 1),
            "redis_backend_use_ssl": {"ssl_cert_reqs": "required", "ssl_ca_certs": str(pki.ca)}}


def worker_env(settings: dict[str, Any]) -> dict[str, str]:
    return {f"WORKER_{name.upper()}": value if isinstance(value, str) else json.dumps(value)
            for name, value in settings.items()}


def run_add(app: App, queue: str) -> Any:
    try:
        return app.send_task("apps.basic.add", (2, 3), queue=queue).get(timeout=20)
    finally:
        app.close()


def publish_error(broker: str, **settings: Any) -> str:
    app = App("tls-client", broker=broker, task_ignore_result=True, **settings)
    try:
        with pytest.raises(Exception) as caught:
            app.send_task("apps.basic.add", (1, 1), queue=f"tls-{uuid.uuid4().hex}")
    finally:
        app.close()
    return str(caught.value)


def exits_with(workers: Any, status: int, **settings: Any) -> str:
    worker = workers.start(env=worker_env(settings), ready=False)
    assert worker.process.wait(timeout=30) == status, worker.log()
    return str(worker.log())


def lines_with(text: str, log: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


# -- Redis: real servers and workers ------------------------------------------------------------


def test_a_worker_takes_a_task_from_rediss_and_stores_its_result_on_rediss_with_the_right_ca(
        workers: Any, redis_tls: RedisTlsServer, pki: Pki) -> None:
    queue = f"tls-{uuid.uuid4().hex}"
    broker = rediss(redis_tls, 0, ssl_cert_reqs="required", ssl_ca_certs=str(pki.ca))
    backend = verified_backend(redis_tls, pki)
    worker = workers.start("-Q", queue, env=worker_env({"broker_url": broker, **backend}))

    assert run_add(App("tls-client", broker=broker, **backend), queue) == 5
    assert "not verify" not in worker.log() and "Cannot connect" not in worker.log()


def test_a_redis_server_whose_certificate_the_ca_did_not_sign_is_refused(
        workers: Any, redis_tls: RedisTlsServer, pki: Pki) -> None:
    broker = rediss(redis_tls, 0, ssl_cert_reqs="required", ssl_ca_certs=str(pki.stranger))
    worker = workers.start(env=worker_env({"broker_url": broker}), ready=False)

    worker.wait_log("Cannot connect to")
    (line,) = lines_with("Cannot connect to", worker.log())[:1]
    assert f"rediss://localhost:{redis_tls.port}/0" in line
    assert "certificate verify failed" in line
    assert "certificate verify failed" in publish_error(broker)


def test_a_redis_certificate_for_another_host_name_is_refused(
        workers: Any, redis_tls: RedisTlsServer, pki: Pki) -> None:
    broker = rediss(redis_tls, 0, host="127.0.0.1", ssl_cert_reqs="required", ssl_ca_certs=str(pki.ca))
    worker = workers.start(env=worker_env({"broker_url": broker}), ready=False)

    worker.wait_log("Cannot connect to")
    (line,) = lines_with("Cannot connect to", worker.log())[:1]
    assert "certificate is not valid for '127.0.0.1'" in line
    assert "certificate is not valid for '127.0.0.1'" in publish_error(broker)


def test_a_result_store_whose_certificate_is_refused_fails_at_once_saying_why(
        workers: Any, redis_tls: RedisTlsServer, pki: Pki) -> None:
    queue = f"tls-{uuid.uuid4().hex}"
    broker = rediss(redis_tls, 0, ssl_cert_reqs="required", ssl_ca_certs=str(pki.ca))
    backend = {"result_backend": rediss(redis_tls, 1),
               "redis_backend_use_ssl": {"ssl_cert_reqs": "required", "ssl_ca_certs": str(pki.stranger)}}
    worker = workers.start("-Q", queue, env=worker_env({"broker_url": broker, **backend}))
    app = App("tls-client", broker=broker)  # no backend of its own: it only sends
    try:
        task_id = app.send_task("apps.basic.add", (2, 3), queue=queue).id
    finally:
        app.close()

    worker.wait_log("retrying does not change that")
    line = lines_with("retrying does not change that", worker.log())[0]
    assert f"cannot store the result of task {task_id}" in line and "certificate verify failed" in line
    assert "retry 1/20" not in worker.log()  # rather than 20 retries a second apart


def test_a_rediss_broker_without_ssl_cert_reqs_stops_the_worker_before_it_starts(
        workers: Any, redis_tls: RedisTlsServer) -> None:
    log = exits_with(workers, 2, broker_url=rediss(redis_tls, 0))

    (line,) = [line for line in log.splitlines() if line.strip()]
    assert (f"the Redis broker at rediss://localhost:{redis_tls.port}/0 uses TLS but ssl_cert_reqs is not "
            f"set") in line
    assert "broker_use_ssl={'ssl_cert_reqs': 'required'" in line


def test_a_rediss_result_backend_without_ssl_cert_reqs_stops_the_worker_before_it_starts(
        workers: Any, redis_tls: RedisTlsServer, pki: Pki) -> None:
    broker = rediss(redis_tls, 0, ssl_cert_reqs="required", ssl_ca_certs=str(pki.ca))
    log = exits_with(workers, 2, broker_url=broker, result_backend=rediss(redis_tls, 1))

    (line,) = [line for line in log.splitlines() if line.strip()]
    assert "the Redis result backend at" in line and "ssl_cert_reqs is not set" in line
    assert "redis_backend_use_ssl={'ssl_cert_reqs': 'required'" in line


def test_ssl_cert_reqs_none_starts_with_one_warning_and_works_without_verifying(
        workers: Any, redis_tls: RedisTlsServer) -> None:
    queue = f"tls-{uuid.uuid4().hex}"
    # no CA and a host the certificate does not name: only an unverified connection gets through
    settings = {"broker_url": rediss(redis_tls, 0, host="127.0.0.1", ssl_cert_reqs="none"),
                "result_backend": rediss(redis_tls, 1, host="127.0.0.1", ssl_cert_reqs="CERT_NONE")}
    worker = workers.start("-Q", queue, env=worker_env(settings))

    assert run_add(App("tls-client", broker=settings["broker_url"], backend=settings["result_backend"]),
                   queue) == 5
    log = worker.log()
    assert len(lines_with("TLS to the Redis broker at", log)) == 1
    assert len(lines_with("TLS to the Redis result backend at", log)) == 1
    assert "does not verify the server's certificate (ssl_cert_reqs='none')" in log


# -- AMQP: a RabbitMQ node of this module's own --------------------------------------------------


def amqps(node: RabbitTlsNode, host: str = "localhost") -> str:
    return f"amqps://guest:guest@{host}:{node.tls_port}//"


def test_a_worker_runs_a_task_over_amqps_with_the_right_ca_and_host_name(
        workers: Any, rabbit_tls: RabbitTlsNode, redis_tls: RedisTlsServer, pki: Pki) -> None:
    queue = f"tls-{uuid.uuid4().hex}"
    settings = {"broker_url": amqps(rabbit_tls), "broker_use_ssl": {"ca_certs": str(pki.ca)},
                **verified_backend(redis_tls, pki)}
    worker = workers.start("-Q", queue, env=worker_env(settings))

    assert run_add(App("tls-client", broker=settings.pop("broker_url"), **settings), queue) == 5
    assert "Cannot connect" not in worker.log() and "host name" not in worker.log()


def test_an_amqp_certificate_of_the_same_ca_for_another_host_name_is_refused(
        workers: Any, rabbit_tls: RabbitTlsNode, pki: Pki) -> None:
    settings = {"broker_url": amqps(rabbit_tls, "127.0.0.1"), "broker_use_ssl": {"ca_certs": str(pki.ca)}}
    worker = workers.start(env=worker_env(settings), ready=False)

    worker.wait_log("Cannot connect to")
    (line,) = lines_with("Cannot connect to", worker.log())[:1]
    assert "certificate is not valid for '127.0.0.1'" in line
    assert "certificate is not valid for '127.0.0.1'" in publish_error(
        settings["broker_url"], broker_use_ssl=settings["broker_use_ssl"])


def test_an_amqp_server_whose_certificate_the_ca_did_not_sign_is_refused(
        workers: Any, rabbit_tls: RabbitTlsNode, pki: Pki) -> None:
    settings = {"broker_url": amqps(rabbit_tls), "broker_use_ssl": {"ca_certs": str(pki.stranger)}}
    worker = workers.start(env=worker_env(settings), ready=False)

    worker.wait_log("Cannot connect to")
    (line,) = lines_with("Cannot connect to", worker.log())[:1]
    assert f"@localhost:{rabbit_tls.tls_port}//" in line
    assert "certificate verify failed" in line


def test_turning_the_amqp_host_name_check_off_works_and_is_warned_about_once(
        workers: Any, rabbit_tls: RabbitTlsNode, redis_tls: RedisTlsServer, pki: Pki) -> None:
    queue = f"tls-{uuid.uuid4().hex}"
    settings = {"broker_url": amqps(rabbit_tls, "127.0.0.1"),
                "broker_use_ssl": {"ca_certs": str(pki.ca), "check_hostname": False},
                **verified_backend(redis_tls, pki)}
    worker = workers.start("-Q", queue, env=worker_env(settings))

    assert run_add(App("tls-client", broker=settings.pop("broker_url"), **settings), queue) == 5
    (line,) = lines_with("does not check the server's host name", worker.log())
    assert "TLS to the AMQP broker at amqps://" in line and f"@127.0.0.1:{rabbit_tls.tls_port}//" in line
    assert "check_hostname=False" in line


# -- Redis: the arguments, without a server ---------------------------------------------------------


def unique_host() -> str:
    # warnings are given once per process and message: a host of its own makes the message new
    return f"redis-{uuid.uuid4().hex[:8]}.example.com"


@pytest.mark.parametrize(("given", "redis_py"), [
    ("required", "required"), ("optional", "optional"), ("none", "none"),
    ("CERT_REQUIRED", "required"), ("CERT_OPTIONAL", "optional"), ("CERT_NONE", "none"),
    (ssl.CERT_REQUIRED, "required"), (ssl.CERT_OPTIONAL, "optional"), (ssl.CERT_NONE, "none"),
    (2, "required"),
])
def test_celerys_spellings_of_ssl_cert_reqs_are_accepted_in_settings(given: Any, redis_py: str) -> None:
    transport = RedisTransport(f"rediss://{unique_host()}:6380/0",
                               Settings(broker_use_ssl={"ssl_cert_reqs": given}))
    assert transport.connection_options()["ssl"]["ssl_cert_reqs"] == redis_py


@pytest.mark.parametrize("given", ["required", "CERT_REQUIRED", "optional", "CERT_NONE", "none"])
def test_celerys_spellings_of_ssl_cert_reqs_are_accepted_in_the_url(given: str) -> None:
    transport = RedisTransport(f"rediss://{unique_host()}:6380/0?ssl_cert_reqs={given}", Settings())
    assert transport.tls is not None
    assert transport.tls.arguments["ssl_cert_reqs"] == given.removeprefix("CERT_").lower()


def test_the_host_name_is_checked_whenever_the_certificate_is() -> None:
    verified = RedisTransport("rediss://redis.example.com:6380/0?ssl_cert_reqs=required", Settings())
    assert verified.connection_options()["ssl"] == {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    unverified = RedisTransport(f"rediss://{unique_host()}:6380/0?ssl_cert_reqs=none", Settings())
    assert unverified.connection_options()["ssl"] == {"ssl_cert_reqs": "none", "ssl_check_hostname": False}


def test_turning_verification_or_the_host_name_check_off_is_warned_about_once(
        caplog: pytest.LogCaptureFixture) -> None:
    host = unique_host()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            RedisTransport(f"rediss://{host}:6380/0?ssl_cert_reqs=none", Settings())
            RedisTransport(f"rediss://{host}:6381/0", Settings(
                broker_use_ssl={"ssl_cert_reqs": "required", "ssl_check_hostname": False}))
    assert [record.getMessage().split(":")[0] for record in caplog.records] == [
        "TLS to the Redis broker at rediss",
        "TLS to the Redis broker at rediss",
    ]
    first, second = (record.getMessage() for record in caplog.records)
    assert "does not verify the server's certificate (ssl_cert_reqs='none')" in first
    assert "does not check the server's host name (ssl_check_hostname=False)" in second


def test_a_url_query_and_a_setting_are_merged_and_kombu_uses_the_result(pki: Pki) -> None:
    url = "rediss://redis.example.com:6380/0?ssl_cert_reqs=CERT_REQUIRED"
    transport = RedisTransport(url, Settings(broker_use_ssl={"ssl_ca_certs": str(pki.ca)}))
    expected = {"ssl_cert_reqs": "required", "ssl_ca_certs": str(pki.ca), "ssl_check_hostname": True}
    assert transport.connection_options()["ssl"] == expected
    # kombu keeps only the URL's ssl_* parameters; the kombu transport puts the resolved ones back
    connection = kombu.Connection(url, transport=transport.kombu_transport(),
                                  **transport.connection_options())
    try:
        assert connection.transport.client.ssl == expected
    finally:
        connection.release()


def test_broker_use_ssl_turns_tls_on_for_a_redis_url_as_in_celery() -> None:
    transport = RedisTransport(f"redis://{unique_host()}:6379/0", Settings(
        broker_use_ssl={"ssl_cert_reqs": "none"}))
    assert transport.connection_options()["ssl"]["ssl_cert_reqs"] == "none"
    assert RedisTransport("redis://127.0.0.1:6379/0", Settings(broker_use_ssl=False)).tls is None
    assert "ssl" not in RedisTransport("redis://127.0.0.1:6379/0", Settings()).connection_options()


@pytest.mark.parametrize(("url", "settings", "expected"), [
    ("rediss://:secret@redis.example.com:6380/0", {},
     "the Redis broker at rediss://:**@redis.example.com:6380/0 uses TLS but ssl_cert_reqs is not set"),
    ("redis://127.0.0.1:6379/0", {"broker_use_ssl": True}, "uses TLS but ssl_cert_reqs is not set"),
    ("rediss://h:6380/0", {"broker_use_ssl": {"ssl_ca_certs": "/etc/hostname"}}, "ssl_cert_reqs is not set"),
    ("rediss://h:6380/0", {"broker_use_ssl": {"ssl_cert_reqs": "requird"}},
     "TLS argument 'ssl_cert_reqs' in broker_use_ssl must be one of 'required', 'optional', 'none', "
     "'CERT_REQUIRED', 'CERT_OPTIONAL', 'CERT_NONE' or ssl.CERT_REQUIRED, ssl.CERT_OPTIONAL, ssl.CERT_NONE "
     "(got 'requird' that is a str). Did you mean 'required'?"),
    ("rediss://h:6380/0?ssl_cert_reqs=2", {},
     "TLS argument 'ssl_cert_reqs' in the broker URL must be one of"),
    ("rediss://h:6380/0", {"broker_use_ssl": {"ca_certs": "/ca.pem"}},
     "unknown TLS argument 'ca_certs' in broker_use_ssl for the Redis broker. Did you mean 'ssl_ca_certs'?"),
    ("rediss://h:6380/0", {"broker_use_ssl": {"ssl_cert_reqs": "required", "ssl_ca_certs": "/no/ca.pem"}},
     "TLS argument 'ssl_ca_certs' in broker_use_ssl must be the path of a readable file (got '/no/ca.pem' "
     "that is a str: there is no readable file there)"),
    ("rediss://h:6380/0?ssl_cert_reqs=required&ssl_check_hostname=perhaps", {},
     "TLS argument 'ssl_check_hostname' in the broker URL must be true or false (got 'perhaps'"),
    ("redis://h:6379/0?ssl_cert_reqs=required", {},
     "has TLS arguments (ssl_cert_reqs) in a redis:// URL, whose query is not read for TLS: write rediss://"),
    ("rediss://h:6380/0?ssl_cert_reqs=none", {"broker_use_ssl": {"ssl_cert_reqs": "required"}},
     "TLS argument ssl_cert_reqs is 'none' in the broker URL but 'required' in broker_use_ssl: give it in "
     "one place"),
    ("rediss://h:6380/0", {"broker_use_ssl": {"ssl_cert_reqs": "required"},
                           "broker_transport_options": {"ssl": {"ssl_cert_reqs": "none"}}},
     "broker_use_ssl and broker_transport_options['ssl'] both give TLS arguments, and they differ"),
    ("rediss://h:6380/0", {"broker_use_ssl": {"ssl_cert_reqs": "none", "ssl_check_hostname": True}},
     "has ssl_check_hostname=True but ssl_cert_reqs='none'"),
    ("rediss://a:6380/0?ssl_cert_reqs=required;rediss://b:6380/0", {},
     "give different TLS arguments: give the same ones in each URL, or give them once in broker_use_ssl"),
])
def test_bad_tls_arguments_of_the_redis_broker_are_refused_with_what_to_write(
        url: str, settings: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        RedisTransport(url, Settings(**settings))
    assert expected in str(caught.value)
    assert "secret" not in str(caught.value)


def test_the_same_arguments_in_broker_use_ssl_and_the_ssl_option_are_fine() -> None:
    same = {"ssl_cert_reqs": "required"}
    transport = RedisTransport("rediss://redis.example.com:6380/0", Settings(
        broker_use_ssl=same, broker_transport_options={"ssl": same}))
    assert transport.connection_options()["ssl"]["ssl_cert_reqs"] == "required"
    assert "ssl" not in transport.options


def test_the_keys_password_is_masked_wherever_tls_arguments_are_shown() -> None:
    arguments = {"ssl_cert_reqs": "required", "ssl_password": "hunter22-key"}
    transport = RedisTransport("rediss://redis.example.com:6380/0", Settings(broker_use_ssl=arguments))
    assert transport.info()["ssl"]["ssl_password"] == MASK
    assert redact_value("broker_use_ssl", arguments)["ssl_password"] == MASK
    other = {"ssl": {"ssl_cert_reqs": "none"}}
    for settings in ({"broker_use_ssl": {**arguments, "ssl_password": 12345678}},
                     {"broker_use_ssl": arguments, "broker_transport_options": other}):
        with pytest.raises(ConfigurationError) as caught:
            RedisTransport("rediss://redis.example.com:6380/0", Settings(**settings))
        assert "hunter22" not in str(caught.value) and "12345678" not in str(caught.value)
        assert MASK in str(caught.value)


@pytest.mark.parametrize(("make", "url"), [
    (RedisTransport, "redis://:hunter22pw@127.0.0.1:99999/0"),
    (RedisTransport, "rediss://:hunter22pw@127.0.0.1:6380/zero?ssl_cert_reqs=required"),
    (RedisBackend, "rediss://:hunter22pw@127.0.0.1:6380/1"),
    (RedisBackend, "redis://:hunter22pw@127.0.0.1:6379/results"),
    (AmqpTransport, "amqps://user:hunter22pw@127.0.0.1:99999//"),
    (AmqpTransport, "amqps://user:hunter22pw@127.0.0.1//?ssl=true"),
])
def test_a_password_in_a_refused_url_is_masked_in_the_error(make: Any, url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make(url, Settings())
    assert "hunter22pw" not in str(caught.value) and ":**@127.0.0.1" in str(caught.value)


def test_the_backends_pool_gets_the_checked_arguments_not_the_urls_text(pki: Pki) -> None:
    import redis

    backend = RedisBackend(f"rediss://redis.example.com:6380/1?ssl_cert_reqs=CERT_REQUIRED&ssl_ca_certs={pki.ca}",
                           Settings())
    pool = backend.config.pool()
    assert pool.connection_class is redis.SSLConnection
    expected = {"ssl_cert_reqs": "required", "ssl_ca_certs": str(pki.ca), "ssl_check_hostname": True}
    assert {name: pool.connection_kwargs[name] for name in expected} == expected


def test_redis_backend_use_ssl_turns_tls_on_for_a_redis_url_as_in_celery(pki: Pki) -> None:
    import redis

    backend = RedisBackend("redis://redis.example.com:6379/1", Settings(
        redis_backend_use_ssl={"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(pki.ca)}))
    assert backend.config.pool().connection_class is redis.SSLConnection
    plain = RedisBackend("redis://redis.example.com:6379/1", Settings())
    assert plain.config.pool().connection_class is redis.Connection


def test_a_sentinel_backends_master_is_reached_over_tls_with_redis_backend_use_ssl() -> None:
    from redis.sentinel import SentinelManagedSSLConnection

    backend = RedisBackend(f"sentinel://{unique_host()}:26379/1", Settings(
        redis_backend_use_ssl={"ssl_cert_reqs": "none"},
        result_backend_transport_options={"master_name": "mymaster"}))
    pool = backend.config.pool()
    assert pool.connection_class is SentinelManagedSSLConnection
    assert pool.connection_kwargs["ssl_cert_reqs"] == "none"


@pytest.mark.parametrize(("url", "use_ssl", "expected"), [
    ("rediss://h:6380/1", None,
     "the Redis result backend at rediss://h:6380/1 uses TLS but ssl_cert_reqs is not set"),
    ("redis://h:6379/1?ssl_cert_reqs=required", None,
     "the result backend URL redis://h:6379/1?ssl_cert_reqs=required has TLS arguments (ssl_cert_reqs) in a "
     "redis:// URL"),
    ("rediss://h:6380/1", {"ssl_cert_reqs": "sometimes"},
     "TLS argument 'ssl_cert_reqs' in redis_backend_use_ssl"),
    ("rediss://h:6380/1", {"ssl_ca_cert": "/ca.pem"}, "Did you mean 'ssl_ca_certs'?"),
])
def test_bad_tls_arguments_of_the_redis_result_backend_are_refused(
        url: str, use_ssl: Any, expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        RedisBackend(url, Settings(redis_backend_use_ssl=use_ssl))
    assert expected in str(caught.value)
    assert "for example" in str(caught.value).lower() or "Did you mean" in str(caught.value)


# -- AMQP: the arguments, without a server -------------------------------------------------------------


def test_amqps_verifies_the_certificate_and_checks_the_urls_host_by_default() -> None:
    from worker_transport_amqp import kombu_transport

    transport = AmqpTransport("amqps://user:pw@localhost:5671/vhost", Settings())
    assert transport.kombu_transport() is kombu_transport.SSLTransport
    # localhost stays localhost: kombu would fill in 127.0.0.1, which a certificate for localhost lacks
    assert transport.connection_options()["ssl"] == {"cert_reqs": ssl.CERT_REQUIRED,
                                                     "server_hostname": "localhost"}
    assert transport.info()["ssl"] == {"cert_reqs": "CERT_REQUIRED", "server_hostname": "localhost"}


def test_broker_use_ssl_turns_tls_on_for_an_amqp_url_as_in_celery(pki: Pki) -> None:
    from worker_transport_amqp import kombu_transport

    transport = AmqpTransport("amqp://rabbit.example.com//",
                              Settings(broker_use_ssl={"ca_certs": str(pki.ca)}))
    assert transport.kombu_transport() is kombu_transport.SSLTransport
    assert transport.connection_options()["ssl"] == {
        "ca_certs": str(pki.ca), "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "rabbit.example.com"}
    for off in (None, False, {}):
        assert AmqpTransport("amqp://rabbit.example.com//", Settings(broker_use_ssl=off)).tls is None


def test_the_host_name_check_and_verification_are_turned_off_only_explicitly_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    host = unique_host()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            unchecked = AmqpTransport(f"amqps://{host}//", Settings(broker_use_ssl={"check_hostname": False}))
            unverified = AmqpTransport(f"amqps://{host}:5600//", Settings(
                broker_transport_options={"ssl": {"cert_reqs": ssl.CERT_NONE}}))
    assert unchecked.connection_options()["ssl"] == {"cert_reqs": ssl.CERT_REQUIRED}
    assert unverified.connection_options()["ssl"] == {"cert_reqs": ssl.CERT_NONE}
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert f"TLS to the AMQP broker at amqps://{host}// does not check the server's host name" in messages[0]
    assert "does not verify the server's certificate (cert_reqs=CERT_NONE)" in messages[1]


def test_a_server_hostname_given_is_the_one_checked() -> None:
    transport = AmqpTransport("amqps://10.0.0.5//",
                              Settings(broker_use_ssl={"server_hostname": "rabbit.internal"}))
    assert transport.connection_options()["ssl"]["server_hostname"] == "rabbit.internal"


@pytest.mark.parametrize(("url", "settings", "expected"), [
    ("amqps://h//", {"broker_use_ssl": {"cert_reqs": "requird"}},
     "TLS argument 'cert_reqs' in broker_use_ssl must be ssl.CERT_REQUIRED, ssl.CERT_OPTIONAL or "
     "ssl.CERT_NONE"),
    ("amqps://h//", {"broker_use_ssl": {"ssl_ca_certs": "/ca.pem"}},
     "unknown TLS argument 'ssl_ca_certs' in broker_use_ssl for the AMQP broker. Did you mean 'ca_certs'?"),
    ("amqps://h//", {"broker_use_ssl": {"context": {}}},
     "unknown TLS argument 'context' in broker_use_ssl for the AMQP broker. Give the CA with ca_certs"),
    ("amqps://h//", {"broker_use_ssl": {"ca_certs": "/no/ca.pem"}},
     "TLS argument 'ca_certs' in broker_use_ssl must be the path of a readable file (got '/no/ca.pem' "
     "that is a str: there is no readable file there)"),
    ("amqps://h//", {"broker_use_ssl": {"check_hostname": "no"}},
     "'check_hostname' in broker_use_ssl must be True"),
    ("amqps://u:secret@h//?ssl_cert_reqs=required", {},
     "broker URL 'amqps://u:**@h//?ssl_cert_reqs=required' has TLS arguments in its query (ssl_cert_reqs); "
     "the AMQP transport takes them from broker_use_ssl"),
    ("amqps://h//", {"broker_use_ssl": True, "broker_transport_options": {"ssl": {"cert_reqs": 0}}},
     "broker_use_ssl and broker_transport_options['ssl'] both give TLS arguments, and they differ "
     "(True and {'cert_reqs': 0})"),
    ("amqps://h//", {"broker_use_ssl": {"cert_reqs": ssl.CERT_NONE, "check_hostname": True}},
     "has check_hostname=True but cert_reqs=ssl.CERT_NONE"),
    ("amqps://h//", {"broker_use_ssl": {"cert_reqs": ssl.CERT_NONE, "server_hostname": "h"}},
     "has server_hostname='h' but cert_reqs=ssl.CERT_NONE"),
    ("amqps://h//", {"broker_use_ssl": {"check_hostname": False, "server_hostname": "h"}},
     "has check_hostname=False and server_hostname='h': server_hostname is the name to check"),
])
def test_bad_tls_arguments_of_the_amqp_broker_are_refused_with_what_to_write(
        url: str, settings: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        AmqpTransport(url, Settings(**settings))
    assert expected in str(caught.value)
    assert "secret" not in str(caught.value)


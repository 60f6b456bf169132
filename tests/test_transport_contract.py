"""Every transport honours the transport contract against a real broker of its kind (the embedded
file, Redis database 8, the shared RabbitMQ with queues of its own), and the contract catches a
transport that breaks a promise, naming it and the check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import AMQP_TEST_URL, empty_redis, redis_db, require_server

from worker_core.slots import Transport
from worker_core.testing import transport_contract
from worker_core.transports.embedded import EmbeddedTransport
from worker_transport_amqp.transport import AmqpTransport
from worker_transport_redis.transport import RedisTransport

REDIS_CONTRACT_URL = redis_db(8)


@pytest.fixture(scope="module")
def redis_db() -> Iterator[str]:
    """Redis database 8, emptied before and after the module (kombu leaves its bindings there)."""
    yield empty_redis(REDIS_CONTRACT_URL)
    empty_redis(REDIS_CONTRACT_URL)


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[type[Transport], str]:
    """The transport class named by the test's parameter, and a URL of a real broker for it."""
    name = request.param
    if name == "embedded":
        return EmbeddedTransport, f"embedded://{tmp_path}/queue.db"
    if name == "redis":
        return RedisTransport, request.getfixturevalue("redis_db")
    require_server(5672, "RabbitMQ")
    return AmqpTransport, AMQP_TEST_URL


@pytest.mark.parametrize("check", transport_contract.CHECKS, ids=transport_contract.check_name)
@pytest.mark.parametrize("broker", ["embedded", "redis", "amqp"], indirect=True)
def test_transport_honours_the_transport_contract(broker: tuple[type[Transport], str],
                                                  check: transport_contract.Check) -> None:
    transport, url = broker
    check(transport, url)


def test_the_contracts_celery_message_is_exactly_what_celerys_client_publishes() -> None:
    from celery import Celery

    task_id = "6f1c0a5e-0000-4000-8000-000000000001"
    body, headers, properties = transport_contract.celery_message(task_id)
    sent = Celery(broker="memory://").amqp.as_task_v2(task_id, "proj.add", args=(2, 3), kwargs={"z": 1},
                                                      origin="gen1@contract")
    assert headers == sent.headers
    assert body == json.loads(json.dumps(sent.body))
    assert {name: properties[name] for name in sent.properties} == sent.properties


# -- the contract catches what a transport gets wrong ---------------------------------------------------


def _fails(transport: type[Transport], url: str, check: str, *expected: str) -> str:
    with pytest.raises(AssertionError) as caught:
        transport_contract.run_all(transport, url, only=[check])
    message = str(caught.value)
    label = f"{transport.__module__}.{transport.__qualname__}"
    assert message.startswith(f"{label} fails check_{check}: "), message
    for text in expected:
        assert text in message, message
    return message


def test_an_amqp_transport_promising_acks_across_a_reconnect_is_caught() -> None:
    require_server(5672, "RabbitMQ")

    class PromisingAmqp(AmqpTransport):
        acks_survive_reconnect: ClassVar[bool] = True

    _fails(PromisingAmqp, AMQP_TEST_URL, "acknowledgements_cross_a_reconnect_only_when_promised",
           "promises acks_survive_reconnect, but acknowledging a message received before the connection "
           "was lost raised")


def test_a_redis_transport_not_promising_acks_across_a_reconnect_is_caught(redis_db: str) -> None:
    class ModestRedis(RedisTransport):
        acks_survive_reconnect: ClassVar[bool] = False

    _fails(ModestRedis, redis_db, "acknowledgements_cross_a_reconnect_only_when_promised",
           "does not promise acks_survive_reconnect, so the broker must deliver again")


def test_a_transport_claiming_the_async_loop_without_a_hub_capable_kombu_transport_is_caught(
    tmp_path: Path,
) -> None:
    class EagerEmbedded(EmbeddedTransport):
        supports_async: ClassVar[bool] = True

    _fails(EagerEmbedded, f"embedded://{tmp_path}/queue.db", "a_kombu_connection_connects_through_it",
           "supports_async is true but its kombu transport", "cannot be driven by kombu's hub")


def test_a_queue_depth_that_miscounts_is_caught(redis_db: str) -> None:
    class Miscounting(RedisTransport):
        def queue_depth(self, connection: Any, queue: str) -> int:
            return super().queue_depth(connection, queue) + 1

    _fails(Miscounting, redis_db, "queue_depth_counts_the_waiting_messages",
           ".queue_depth() of a queue that does not exist is 1, not 0")


def test_connection_options_shared_between_connections_are_caught(tmp_path: Path) -> None:
    class Sharing(EmbeddedTransport):
        def connection_options(self) -> dict[str, Any]:
            if not hasattr(self, "shared"):
                self.shared = super().connection_options()
            return self.shared

    _fails(Sharing, f"embedded://{tmp_path}/queue.db",
           "it_is_built_from_a_url_and_settings_without_connecting", "must return an equal new mapping")


def test_a_class_missing_members_is_caught(tmp_path: Path) -> None:
    class Hollow:
        supports_async: ClassVar[bool] = False

        def __init__(self, url: str, settings: Any) -> None:
            self.url = url

    _fails(Hollow, f"embedded://{tmp_path}/queue.db",  # type: ignore[arg-type]
           "the_class_satisfies_the_transport_protocol",
           "lacks kombu_transport, connection_options, queue_depth: every transport must provide them")

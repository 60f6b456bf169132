"""Every transport that elects leaders honours the lease contract against a real broker of its kind
(the embedded file, a Redis database, the suite's RabbitMQ virtual host): one holder at a time,
larger fencing tokens, a takeover within the stated bound after a release, a silent holder or a
cut connection, messages sent once per key and refused from a holder that lost the lease."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import AMQP_TEST_URL, empty_redis, redis_db, require_server

from worker_core.slots import ElectsLeaders, KeepsRecords, Transport
from worker_core.testing import lease_contract
from worker_core.transports.embedded import EmbeddedTransport
from worker_transport_amqp.transport import AmqpTransport
from worker_transport_redis.transport import RedisTransport

REDIS_LEASE_URL = redis_db(5)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """Redis database 5, emptied before and after the module."""
    yield empty_redis(REDIS_LEASE_URL)
    empty_redis(REDIS_LEASE_URL)


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[type[Transport], str]:
    """The transport class named by the test's parameter, and a URL of a real broker for it."""
    name = request.param
    if name == "embedded":
        return EmbeddedTransport, f"embedded://{tmp_path}/queue.db"
    if name == "redis":
        return RedisTransport, request.getfixturevalue("redis_url")
    require_server(5672, "RabbitMQ")
    return AmqpTransport, AMQP_TEST_URL


@pytest.mark.parametrize("check", lease_contract.CHECKS, ids=lease_contract.check_name)
@pytest.mark.parametrize("broker", ["embedded", "redis", "amqp"], indirect=True)
def test_transport_honours_the_lease_contract(broker: tuple[type[Transport], str],
                                              check: lease_contract.Check) -> None:
    transport, url = broker
    check(transport, url)


def test_the_transports_offer_what_they_say() -> None:
    assert issubclass(EmbeddedTransport, ElectsLeaders) and issubclass(EmbeddedTransport, KeepsRecords)
    assert issubclass(RedisTransport, ElectsLeaders) and issubclass(RedisTransport, KeepsRecords)
    assert issubclass(AmqpTransport, ElectsLeaders) and not issubclass(AmqpTransport, KeepsRecords)

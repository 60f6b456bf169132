"""Every transport that elects leaders honours the lease contract against a real broker of its kind
(the embedded file, a Redis database, the suite's RabbitMQ virtual host): one holder at a time,
larger fencing tokens, a takeover within the stated bound after a release, a silent holder or a
cut connection, messages sent once per key and refused from a holder that lost the lease."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import AMQP_TEST_URL, empty_redis, redis_db, require_server

from worker_core import Settings
from worker_core.slots import ElectsLeaders, KeepsRecords, Transport
from worker_core.testing import lease_contract
from worker_core.transports.embedded import EmbeddedTransport
from worker_transport_amqp.transport import AmqpTransport
from worker_transport_postgres.transport import PostgresTransport
from worker_transport_redis.transport import RedisTransport

REDIS_LEASE_URL = redis_db(5)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """Redis database 5, emptied before and after the module."""
    yield empty_redis(REDIS_LEASE_URL)
    empty_redis(REDIS_LEASE_URL)


@pytest.fixture(scope="module")
def postgres_schema() -> Iterator[str]:
    """A schema of the module's own in the suite's PostgreSQL database (dropped afterwards)."""
    from postgres import POSTGRES_URL, temporary_schema

    with temporary_schema(POSTGRES_URL, "worker_leases") as schema:
        yield schema


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[type[Transport], str, Settings | None]:
    """The transport class named by the test's parameter, and a URL of a real broker for it."""
    name = request.param
    if name == "embedded":
        return EmbeddedTransport, f"embedded://{tmp_path}/queue.db", None
    if name == "redis":
        return RedisTransport, request.getfixturevalue("redis_url"), None
    if name == "postgres":
        from postgres import POSTGRES_URL

        require_server(5432, "PostgreSQL")
        schema = request.getfixturevalue("postgres_schema")
        return PostgresTransport, POSTGRES_URL, Settings(broker_transport_options={"schema": schema})
    require_server(5672, "RabbitMQ")
    return AmqpTransport, AMQP_TEST_URL, None


@pytest.mark.parametrize("check", lease_contract.CHECKS, ids=lease_contract.check_name)
@pytest.mark.parametrize("broker", ["embedded", "redis", "amqp", "postgres"], indirect=True)
def test_transport_honours_the_lease_contract(broker: tuple[type[Transport], str, Settings | None],
                                              check: lease_contract.Check) -> None:
    transport, url, settings = broker
    check(transport, url, settings=settings)


def test_the_transports_offer_what_they_say() -> None:
    assert issubclass(EmbeddedTransport, ElectsLeaders) and issubclass(EmbeddedTransport, KeepsRecords)
    assert issubclass(RedisTransport, ElectsLeaders) and issubclass(RedisTransport, KeepsRecords)
    assert issubclass(AmqpTransport, ElectsLeaders) and not issubclass(AmqpTransport, KeepsRecords)
    assert issubclass(PostgresTransport, ElectsLeaders) and issubclass(PostgresTransport, KeepsRecords)

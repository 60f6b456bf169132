"""What tells a broker refusing work apart from a lost connection, and how the worker keeps it: Redis's
error replies parsed as redis-py parses them, the jittered delay between tries, and the broker
state's one line each way (the full brokers themselves: tests/test_full_broker.py and
tests/test_broker_blocked.py)."""

from __future__ import annotations

import logging

import pytest
from redis._parsers.base import BaseParser

from worker_core.consumer.brokerstate import START, TRANSPORT, BrokerState, backoff_delay
from worker_transport_redis.refusals import Backoff, refusal
from worker_transport_redis.transport import RedisTransport


@pytest.mark.parametrize(("reply", "meaning"), [
    ("OOM command not allowed when used memory > 'maxmemory'.", "out of memory"),
    ("READONLY You can't write against a read only replica.", "read-only replica"),
    ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", "busy"),
    ("LOADING Redis is loading the dataset in memory", "loading its data set"),
    ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", "lost its master"),
])
def test_each_refusal_redis_replies_is_told_apart_from_other_errors(reply: str, meaning: str) -> None:
    error = BaseParser.parse_error(reply)  # what redis-py raises for the reply
    assert meaning in str(refusal(error))
    assert RedisTransport.refusal(error) == f"Redis refuses work: {refusal(error)}"


def test_a_refusal_inside_a_pipeline_is_a_refusal_and_other_errors_are_not() -> None:
    from redis.exceptions import ConnectionError, ResponseError

    inner = "OOM command not allowed when used memory > 'maxmemory'."
    wrapped = ResponseError(f"Command # 1 (HGET h a) of pipeline caused error: {inner}")
    assert "out of memory" in str(refusal(wrapped))
    assert refusal(BaseParser.parse_error("ERR unknown command 'FOO'")) is None
    assert refusal(BaseParser.parse_error("NOSCRIPT No matching script.")) is None
    assert refusal(ConnectionError("Error 111 connecting")) is None


def test_the_delay_between_tries_grows_is_jittered_and_bounded() -> None:
    backoff = Backoff(first=0.2, cap=5.0)
    delays = [backoff.failed() for _ in range(12)]
    for attempt, delay in enumerate(delays):
        ceiling = min(5.0, 0.2 * 2 ** attempt)
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 5.0 and not backoff.is_due()
    backoff.reset()
    assert backoff.is_due()
    assert all(5.0 <= backoff_delay(30) <= 10.0 for _ in range(20))


def test_a_refusal_is_said_once_when_it_starts_and_once_when_it_ends(caplog) -> None:
    told = []
    state = BrokerState(notify=lambda hook, **details: told.append((hook, details)))
    caplog.set_level(logging.WARNING, "worker.consumer")
    for _ in range(5):  # seen again and again while it lasts
        state.refused("Redis refuses work: out of memory")
    state.refused_by(START, "Redis refuses work: out of memory")
    assert state.info()["refusing"] == "Redis refuses work: out of memory"
    state.accepted_by(START)
    assert state.refusing  # the transport still sees it
    state.accepted_by(TRANSPORT)
    state.accepted()  # (none open: nothing)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("Redis refuses work: out of memory. The worker keeps its connection")
    assert lines[1].startswith("The broker takes work again after ")
    assert [hook for hook, _ in told] == ["broker_refused", "broker_accepted"]
    info = state.info()
    assert info["refusing"] is None and info["refusals"] == 1 and info["refusing_for"] is None
    assert info["refused_seconds"] >= 0

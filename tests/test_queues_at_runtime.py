"""Consuming more or fewer queues while the worker runs (Celery's add_consumer and
cancel_consumer)."""

from __future__ import annotations

import pytest
from apps import basic
from workers import TESTS, ask

from worker_core.exceptions import ResultTimeout


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_add_and_cancel_consumer_change_the_queues_consumed(workers, embedded_broker, pool):
    workers.start("-Q", "first", pool=pool, broker=embedded_broker, env={"PYTHONPATH": str(TESTS)})
    later = basic.add.apply_async((1, 2), queue="second")
    with pytest.raises(ResultTimeout):
        later.get(timeout=0.5)
    assert ask(basic.app, "add_consumer", queue="second") == {"ok": "add consumer second"}
    assert later.get(timeout=20) == 3
    assert ask(basic.app, "add_consumer", queue="second") == {"ok": "already consuming from 'second'"}
    assert [q["name"] for q in ask(basic.app, "active_queues")] == ["first", "second"]
    assert ask(basic.app, "cancel_consumer", queue="first") == {"ok": "no longer consuming from first"}
    waiting = basic.add.apply_async((2, 2), queue="first")
    assert basic.add.apply_async((3, 3), queue="second").get(timeout=20) == 6
    with pytest.raises(ResultTimeout):
        waiting.get(timeout=0.5)
    assert [q["name"] for q in ask(basic.app, "active_queues")] == ["second"]
    assert ask(basic.app, "add_consumer", queue="first") == {"ok": "add consumer first"}
    assert waiting.get(timeout=20) == 4


@pytest.mark.parametrize(("command", "arguments", "error"), [
    ("add_consumer", {"queue": ""}, "add_consumer needs one queue name"),
    ("add_consumer", {"queue": "a,b"}, "add_consumer needs one queue name"),
    ("add_consumer", {"queue": "x", "exchange": "other", "exchange_type": "nonsense"},
     "cannot consume from 'x': add_consumer 'x': exchange type must be one of direct, topic, fanout, "
     "headers"),
    ("cancel_consumer", {"queue": "nope"}, "not consuming from 'nope'; the queues consumed are first"),
])
def test_bad_queue_commands_get_an_error_and_change_nothing(workers, embedded_broker, command, arguments,
                                                            error):
    workers.start("-Q", "first", broker=embedded_broker, env={"PYTHONPATH": str(TESTS)})
    answer = ask(basic.app, command, **arguments)
    assert isinstance(answer, dict) and answer["error"].startswith(error)
    assert [q["name"] for q in ask(basic.app, "active_queues")] == ["first"]

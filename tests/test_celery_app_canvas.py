"""Canvas with a Celery project's own tasks under ``workerctl worker`` (worker-celery): a real
Celery client sends chains, callbacks, errbacks, chords, groups, Celery's built-in tasks, replace
and add_to_chord; Celery's tracer in the prefork children runs what follows each task, on Redis
and on RabbitMQ (results on Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    AMQP_TEST_URL,
    REDIS_PORT,
    WorkerFactory,
    delete_queue,
    empty_redis,
    redis_db,
    require_server,
)
from workers import wait_for

pytestmark = pytest.mark.timeout(120)

PROJ = "apps.celery_proj.tasks"


class Canvas:
    """A Celery client whose signatures go to the worker's queue, and the project's signal log."""

    def __init__(self, app: Any, log: Path) -> None:
        self.app = app
        self.log = log

    def s(self, name: str, *args: Any, **options: Any) -> Any:
        return self.app.signature(f"{PROJ}.{name}", args=args, **options)

    def si(self, name: str, *args: Any) -> Any:
        return self.app.signature(f"{PROJ}.{name}", args=args, immutable=True)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture(scope="module", params=["redis", "amqp"])
def canvas(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Canvas]:
    from celery import Celery

    require_server(REDIS_PORT, "Redis")
    results = empty_redis(redis_db(4))
    queue = f"canvas-{uuid.uuid4().hex[:8]}"
    if request.param == "redis":
        broker = empty_redis(redis_db(3))
    else:
        require_server(5672, "RabbitMQ")
        broker = AMQP_TEST_URL
    root = tmp_path_factory.mktemp(f"canvas-{request.param}")
    log = root / "signals.log"
    factory = WorkerFactory(root)
    env = {"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": results, "CELERY_PROJ_QUEUE": queue,
           "CELERY_PROJ_SIGNALS": str(log)}
    factory.start("-c", "2", app="apps.celery_proj", pool="prefork", env=env)
    app = Celery("canvas-client", broker=broker, backend=results)
    app.conf.update(broker_connection_retry_on_startup=True, task_default_queue=queue)
    yield Canvas(app, log)
    app.close()
    factory.cleanup()
    delete_queue(broker, queue)


def test_a_chain_passes_each_result_on(canvas: Canvas) -> None:
    from celery import chain

    result = chain(canvas.s("add", 1, 2), canvas.s("add", 3), canvas.s("mul", 10)).apply_async()
    assert result.get(timeout=20) == 60
    assert result.parent.get(timeout=5) == 6 and result.parent.parent.get(timeout=5) == 3


def test_a_chain_of_immutable_signatures_ignores_the_results(canvas: Canvas) -> None:
    from celery import chain

    assert chain(canvas.si("add", 1, 1), canvas.si("add", 2, 2), canvas.si("mul", 3, 3)).apply_async().get(
        timeout=20) == 9


def test_link_sends_the_callback_with_the_result(canvas: Canvas) -> None:
    callback = canvas.s("identity")
    result = canvas.s("add", 4, 4).apply_async(link=callback)
    assert result.get(timeout=20) == 8
    wait_for(lambda: result.children, 10, message="the callback among the children")
    assert result.children[0].get(timeout=20) == 8


def test_link_error_calls_both_kinds_of_errback(canvas: Canvas) -> None:
    from apps.celery_proj.tasks import Boom

    failing = canvas.s("boom", "linked")
    result = failing.apply_async(link_error=[canvas.s("on_error"), canvas.s("on_error_id")])
    with pytest.raises(Boom):
        result.get(timeout=20)
    wait_for(lambda: f"errback {result.id} Boom" in " ".join(canvas.lines()), 10,
             message="the inline errback")
    wait_for(lambda: f"errback-id {result.id}" in " ".join(canvas.lines()), 10, message="the errback task")


def test_a_chord_sends_its_body_the_header_results(canvas: Canvas) -> None:
    from celery import chord

    result = chord([canvas.s("add", i, i) for i in range(10)], canvas.s("tsum")).apply_async()
    assert result.get(timeout=30) == 90


def test_a_chord_whose_header_fails_fails_its_body_and_calls_its_errback(canvas: Canvas) -> None:
    from apps.celery_proj.tasks import Boom
    from celery import chord
    from celery.exceptions import ChordError

    body = canvas.s("tsum").on_error(canvas.s("on_error_id"))
    result = chord([canvas.s("add", 1, 1), canvas.s("boom", "header")], body).apply_async()
    with pytest.raises(Boom):  # as Celery's client does, get() raises the failed header's error first
        result.get(timeout=30)
    wait_for(lambda: result.state == "FAILURE", 10, message="the body's FAILURE")
    assert isinstance(result.result, ChordError)
    assert "raised Boom('header')" in str(result.result)
    wait_for(lambda: f"errback-id {result.id}" in " ".join(canvas.lines()), 10, message="the body's errback")


def test_a_group_of_chains_runs_every_chain(canvas: Canvas) -> None:
    from celery import chain, group

    result = group(chain(canvas.s("add", i, i), canvas.s("mul", 2)) for i in range(4)).apply_async()
    assert result.get(timeout=30) == [0, 4, 8, 12]


def test_a_chain_inside_a_chord_and_a_chord_inside_a_chain(canvas: Canvas) -> None:
    from celery import chain, chord

    inner = chord([chain(canvas.s("add", i, 1), canvas.s("mul", 2)) for i in range(3)], canvas.s("tsum"))
    assert inner.apply_async().get(timeout=30) == 12  # (1 + 2 + 3) * 2
    outer = chain(canvas.s("add", 1, 1), chord([canvas.s("mul", 2), canvas.s("mul", 3)], canvas.s("tsum")),
                  canvas.s("add", 100))
    assert outer.apply_async().get(timeout=30) == 110  # 2*2 + 2*3 + 100


def test_celerys_built_in_map_starmap_and_chunks(canvas: Canvas) -> None:
    from celery.canvas import chunks, xmap, xstarmap

    add, identity = canvas.s("add"), canvas.s("identity")
    app = canvas.app
    assert xmap(identity, [1, 2, 3], app=app).apply_async().get(timeout=20) == [1, 2, 3]
    assert xstarmap(add, [(1, 1), (2, 2)], app=app).apply_async().get(timeout=20) == [2, 4]
    assert chunks(add, [(i, i) for i in range(6)], 3, app=app).apply_async().get(timeout=20) == [
        [0, 2, 4], [6, 8, 10]]


def test_replace_and_add_to_chord(canvas: Canvas) -> None:
    from celery import chord

    assert canvas.s("replaced", 7).apply_async().get(timeout=20) == 70
    grown = chord([canvas.s("grows_chord", 1), canvas.s("identity", 2)], canvas.s("tsum")).apply_async()
    assert grown.get(timeout=30) == 103  # 1 + 2 + the added 100

"""This project's client sends canvases to a real Celery worker, on Redis and on RabbitMQ (results
in Redis), and gets what Celery's own client gets for the same canvases: values, result parents,
children, errbacks, and group results saved by one client and restored by the other. The same
Celery app runs under ``workerctl worker`` too (worker-celery), with the same results."""

from __future__ import annotations

import time
import uuid

import pytest
from apps import basic
from canvas_shapes import WORKFLOWS, celery_client, our_client, parents
from conftest import REDIS_TEST_URL, delete_queue
from workers import wait_for


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    request.getfixturevalue("redis_url")  # results live in Redis either way
    return request.getfixturevalue("amqp_url")


@pytest.fixture
def queue(broker, workers):
    name = f"canvas-{uuid.uuid4().hex[:8]}"
    yield name
    workers.cleanup()
    delete_queue(broker, name)


@pytest.fixture(params=["celery worker", "workerctl worker"])
def celery_worker(request, workers, broker, queue):
    """The Celery app apps.celery_basic on the test's queue, sending the next steps of workflows
    there too: under Celery's worker, and unchanged under this worker (worker-celery runs each
    task through Celery's tracer, which sends what follows it)."""
    env = {"CELERY_DEFAULT_QUEUE": queue}
    if request.param == "celery worker":
        return workers.start_celery("-Q", queue, broker=broker, backend=REDIS_TEST_URL, env=env)
    return workers.start("-Q", queue, "-c", "2", app="apps.celery_basic", pool="prefork",
                         env={**env, "CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": REDIS_TEST_URL})


@pytest.fixture
def ours(broker, queue):
    with our_client(broker, queue) as client:
        yield client


@pytest.fixture
def theirs(broker, queue):
    with celery_client(broker, queue) as client:
        yield client


@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
def test_our_canvases_run_on_a_celery_worker_as_celerys_own(celery_worker, ours, theirs):
    sent = {name: (build(ours), build(theirs), expected) for name, (build, expected) in WORKFLOWS.items()}
    for name, (our_result, their_result, expected) in sent.items():
        value = our_result.get(timeout=30)
        assert value == expected == their_result.get(timeout=30), name
        # the same chain of results back to the first task, each holding what Celery's does
        ours_chain, theirs_chain = parents(our_result), parents(their_result)
        assert [type(r).__name__ for r in ours_chain] == [type(r).__name__ for r in theirs_chain], name
        for mine, celerys in zip(ours_chain[1:], theirs_chain[1:], strict=True):
            assert mine.get(timeout=30) == celerys.get(timeout=30), name


def test_a_failure_in_a_chain_fails_the_chain_as_with_celerys_client(celery_worker, ours, theirs):
    for t in (ours, theirs):
        result = (t.add.s(1, 1) | t.boom.si("in the middle") | t.add.s(1)).delay()
        with pytest.raises(basic.Boom, match="in the middle"):
            result.get(timeout=30)
        assert result.parent.failed() and result.parent.parent.get(timeout=30) == 2


def test_callbacks_and_errbacks_reach_a_celery_worker(celery_worker, ours, theirs, tmp_path):
    for t in (ours, theirs):
        result = t.add.apply_async((2, 2), link=t.mul.s(10))
        assert result.get(timeout=30) == 4
        [child] = result.children  # the callback, as the worker recorded it with the result
        assert child.get(timeout=30) == 40
        failures = tmp_path / f"failures-{type(t.app).__name__}"
        failed = t.boom.apply_async(("errback",), link_error=t.note_failure.s(str(failures)))
        with pytest.raises(basic.Boom):
            failed.get(timeout=30)
        def noted(path=failures, task_id=failed.id):
            return path.exists() and path.read_text().split() == [task_id]

        wait_for(noted, timeout=20, message=f"the errback of {failed.id}")
        sig = t.add.s(1, 1)
        sig.link(t.mul.s(3))
        assert sig.delay().get(timeout=30) == 2


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_group_result_saved_by_one_client_is_restored_by_the_other(celery_worker, ours, theirs):
    from celery.result import GroupResult as CeleryGroupResult

    saved = ours.group(ours.add.s(i, i) for i in range(3)).delay()
    saved.save()
    restored = CeleryGroupResult.restore(saved.id, app=theirs.app)
    assert [r.id for r in restored.results] == [r.id for r in saved.results]
    assert restored.get(timeout=30) == [0, 2, 4]

    theirs_saved = theirs.group(theirs.add.s(i, i) for i in range(2)).delay()
    theirs_saved.save()
    mine = basic.app.GroupResult.restore(theirs_saved.id)
    assert mine is not None and [r.id for r in mine] == [r.id for r in theirs_saved.results]
    assert mine.get(timeout=30) == [0, 2]
    assert (mine.ready(), mine.successful(), mine.failed(), mine.completed_count()) == (True, True, False, 2)
    mine.delete()
    assert basic.app.GroupResult.restore(theirs_saved.id) is None
    assert CeleryGroupResult.restore(theirs_saved.id, app=theirs.app) is None


def test_a_group_result_reports_failures_and_progress(celery_worker, ours):
    result = ours.group(ours.add.s(1, 1), ours.boom.si("one of them"), ours.add.s(2, 2)).delay()
    with pytest.raises(basic.Boom, match="one of them"):
        result.get(timeout=30)
    values = result.join(timeout=30, propagate=False)
    assert values[0] == 2 and isinstance(values[1], basic.Boom) and values[2] == 4
    assert (result.ready(), result.successful(), result.failed(), result.completed_count()) == (
        True, False, True, 2)
    assert not result.waiting() and len(result) == 3
    assert [r.id for r in result] == [r.id for r in result.results]


def test_a_group_results_get_gives_up_after_its_timeout(workers, ours, broker, queue):
    from worker_core.exceptions import ResultTimeout

    result = ours.group(ours.add.s(1, 1), ours.add.s(2, 2)).delay()  # no worker: nothing runs
    began = time.monotonic()
    with pytest.raises(ResultTimeout):
        result.get(timeout=0.5)
    assert time.monotonic() - began < 5
    assert not result.ready() and result.waiting() and result.completed_count() == 0

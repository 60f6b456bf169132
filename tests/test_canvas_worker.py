"""This worker does what follows a task as Celery's worker does: canvases sent by a real Celery
5.7 client and by this project's client run on it, on Redis and on RabbitMQ (results in Redis),
under the solo and prefork pools, with the values, parents, children, errbacks and chord
failures Celery's worker gives; a chain hops between a Celery worker and this one, and a chord's
header is split between them."""

from __future__ import annotations

import json
import re
import types
import uuid
from pathlib import Path

import celery.exceptions
import pytest
from apps import basic
from canvas_shapes import TASKS, WORKFLOWS, celery_client, our_client, parents
from conftest import REDIS_TEST_URL, delete_queue
from workers import wait_for

from worker_core.exceptions import CanvasError, ChordError


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


def start_ours(workers, broker: str, queue: str, pool: str = "solo", *args: str, env: dict | None = None):
    """This worker on ``queue``, sending what follows a task there too (its default queue)."""
    concurrency = ["-c", "2"] if pool == "prefork" else []
    return workers.start("-Q", queue, *concurrency, *args, pool=pool, broker=broker, backend=REDIS_TEST_URL,
                         env={"WORKER_TASK_DEFAULT_QUEUE": queue, **(env or {})})


@pytest.fixture
def ours(broker, queue):
    with our_client(broker, queue) as client:
        yield client


@pytest.fixture
def theirs(broker, queue):
    with celery_client(broker, queue) as client:
        yield client


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# -- every canvas, from either client --------------------------------------------------------------


@pytest.mark.parametrize("pool", ["solo", "prefork"])
@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
def test_every_canvas_from_either_client_runs_on_this_worker(workers, broker, queue, pool, ours, theirs):
    start_ours(workers, broker, queue, pool)
    for name, (build, expected) in WORKFLOWS.items():
        for client in (theirs, ours):
            result = build(client)
            assert result.get(timeout=30) == expected, (name, client.app)
            for node in parents(result)[1:]:  # every step before the last has its result too
                assert node.get(timeout=30) is not None, (name, client.app)


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_failure_fails_the_rest_of_its_chain_and_calls_both_kinds_of_errback(workers, broker, queue, pool,
                                                                             ours, theirs, tmp_path):
    start_ours(workers, broker, queue, pool)
    for client in (theirs, ours):
        sent_errbacks = tmp_path / f"sent-{client.app.main}"
        inline_errbacks = tmp_path / f"inline-{client.app.main}"
        result = (client.add.s(1, 1) | client.boom.si("in the middle") | client.add.s(1) | client.mul.s(2)
                  ).apply_async(link_error=[client.note_failure.s(str(sent_errbacks)),
                                            client.log_error.s(str(inline_errbacks))])
        with pytest.raises(basic.Boom, match="in the middle"):
            result.get(timeout=30)
        steps = parents(result)
        # FAILURE stored under every step after the failed one, as Celery's worker stores it
        wait_for(lambda steps=steps: all(step.ready() for step in steps), timeout=20, message="every step")
        assert [step.state for step in steps] == ["FAILURE", "FAILURE", "FAILURE", "SUCCESS"]
        assert str(steps[1].result) == str(steps[2].result) == "in the middle"
        failed = steps[2].id
        wait_for(lambda path=sent_errbacks: _lines(path), timeout=20, message="the errback sent as a task")
        assert _lines(sent_errbacks) == [failed]  # sent with the failed task's id
        # called where the task failed, with its request, exception and traceback
        assert _lines(inline_errbacks) == [f"{failed} Boom:in the middle True"]


def test_callbacks_one_several_and_groups_are_sent_as_children_of_the_task(workers, broker, queue, ours,
                                                                          theirs):
    start_ours(workers, broker, queue, "prefork")
    for client in (theirs, ours):
        one = client.add.apply_async((2, 2), link=client.mul.s(10))
        assert one.get(timeout=30) == 4
        [child] = one.children
        assert child.get(timeout=30) == 40
        several = client.add.apply_async((2, 2), link=[client.mul.s(10), client.group(client.add.s(1),
                                                                                      client.add.s(2)),
                                                       client.mul.s(100)])
        assert several.get(timeout=30) == 4
        # a group callback on its own, then the plain ones together as one group (Celery's order)
        assert [child.get(timeout=30) for child in several.children] == [[5, 6], [40, 400]]


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_failing_chord_header_fails_the_body_with_chord_error_and_runs_its_errback(
        workers, broker, queue, pool, ours, theirs, tmp_path):
    start_ours(workers, broker, queue, pool)
    for client, error in ((theirs, celery.exceptions.ChordError), (ours, ChordError)):
        errbacks = tmp_path / f"errbacks-{client.app.main}"
        header = [client.add.s(1, 1), client.boom.s("in the header"), client.add.s(2, 2)]
        result = client.chord(header, client.tsum.s().on_error(client.note_failure.s(str(errbacks)))).delay()
        failed = result.parent.results[1].id
        wait_for(result.ready, timeout=30, message="the chord's body to fail")
        assert result.state == "FAILURE"
        assert isinstance(result.result, error)
        assert str(result.result) == f"Dependency {failed} raised Boom('in the header')"
        wait_for(lambda path=errbacks: _lines(path), timeout=20, message="the body's errback")
        assert _lines(errbacks) == [result.id]


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_retry_calls_no_errback_and_keeps_its_place_in_the_workflow(workers, broker, queue, ours, theirs,
                                                                      tmp_path):
    start_ours(workers, broker, queue, "prefork")
    for client in (theirs, ours):
        errbacks = tmp_path / f"errbacks-{client.app.main}"
        result = client.flaky.apply_async((2,), link=client.add.s(10),
                                          link_error=client.note_failure.s(str(errbacks)))
        assert result.get(timeout=30) == 2
        [callback] = result.children
        assert callback.get(timeout=30) == 12
        assert (client.flaky.s(1) | client.add.s(5)).delay().get(timeout=30) == 6
        in_a_chord = client.chord([client.flaky.s(1), client.add.s(1, 1)], client.tsum.s()).delay()
        assert in_a_chord.get(timeout=30) == 3
        assert _lines(errbacks) == []


def test_every_canvas_of_this_client_runs_on_the_embedded_transport_and_backend(workers, tmp_path):
    """No server: chords are counted in the embedded file, by a prefork worker's processes."""
    from worker_core import canvas

    url = f"embedded://{tmp_path}/queue.db"
    workers.start("-c", "2", pool="prefork", broker=url, backend=url)
    basic.app.conf.update(broker_url=url, result_backend=url)
    t = types.SimpleNamespace(app=basic.app, chain=canvas.chain, group=canvas.group, chord=canvas.chord,
                              **{name: basic.app.tasks[f"apps.basic.{name}"] for name in TASKS})
    try:
        for name, (build, expected) in WORKFLOWS.items():
            assert build(t).get(timeout=30) == expected, name
        failing = t.chord([t.add.s(1, 1), t.boom.s("embedded")], t.tsum.s()).delay()
        wait_for(failing.ready, timeout=30, message="the body of a failing chord")
        assert str(failing.result) == f"Dependency {failing.parent.results[1].id} raised Boom('embedded')"
    finally:
        basic.app.conf.update(broker_url=None, result_backend=None)
        basic.app.close()


# -- what Celery's worker stores ------------------------------------------------------------------


def _metas(broker_url: str, result) -> list[dict]:
    """The stored meta of ``result``, the results before it and the children of each, ids
    replaced by their order of appearance, and what differs between two workers (times, the
    traceback's lines, the worker's name and queue) dropped, for comparing two runs."""
    import redis

    client = redis.Redis.from_url(REDIS_TEST_URL)
    seen: dict[str, str] = {}

    def name(value):
        if isinstance(value, str) and len(value) == 36 and value.count("-") == 4:
            return seen.setdefault(value, f"<id {len(seen)}>")
        if isinstance(value, list):
            return [name(item) for item in value]
        if isinstance(value, dict):
            return {key: name(item) for key, item in sorted(value.items())
                    if key not in ("date_done", "traceback", "worker", "queue")}
        return value

    metas, pending = [], list(reversed(parents(result)))
    while pending:
        node = pending.pop(0)
        nodes = node.results if hasattr(node, "results") else [node]
        for each in nodes:
            key = f"celery-task-meta-{each.id}"
            # what followed the result waited for may still be running
            raw = wait_for(lambda key=key: (value := client.get(key)) and json.loads(value).get("status") in
                           ("SUCCESS", "FAILURE") and value, timeout=20, message=f"the result in {key}")
            meta = json.loads(raw)
            metas.append(name(meta))
            pending.extend(each.children or [])
    client.close()
    return metas


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_results_are_stored_with_the_children_and_ids_celerys_worker_stores(workers, broker, theirs):
    celery_queue, our_queue = f"celery-{uuid.uuid4().hex[:8]}", f"ours-{uuid.uuid4().hex[:8]}"
    workers.start_celery("-Q", celery_queue, broker=broker, backend=REDIS_TEST_URL,
                         env={"CELERY_DEFAULT_QUEUE": celery_queue, "CELERY_RESULT_EXTENDED": "1"})
    start_ours(workers, broker, our_queue, "solo", env={"WORKER_RESULT_EXTENDED": "1"})
    t = theirs
    canvases = [
        lambda: (t.add.s(1, 1) | t.add.s(2) | t.mul.s(3)),
        lambda: t.add.signature((2, 2), link=[t.mul.s(10), t.group(t.add.s(1), t.add.s(2)), t.mul.s(100)]),
        lambda: t.chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s() | t.mul.s(10)),
        lambda: (t.add.s(1, 1) | t.group(t.mul.s(2), t.mul.s(3)) | t.tsum.s()),
        lambda: t.group(t.add.s(1, 1) | t.mul.s(2), t.add.s(3, 3)),
    ]
    try:
        for make in canvases:
            runs = []
            for queue in (celery_queue, our_queue):
                result = make().apply_async(queue=queue)
                result.get(timeout=30)
                runs.append(result)
            celerys, ours_ = (_metas(broker, run) for run in runs)
            assert ours_ == celerys
    finally:
        for name in (celery_queue, our_queue):
            delete_queue(broker, name)


# -- mixed fleets ---------------------------------------------------------------------------------


@pytest.fixture
def two_fleets(workers, broker):
    """A Celery worker and this worker, each on a queue of its own."""
    celery_queue, our_queue = f"celery-{uuid.uuid4().hex[:8]}", f"ours-{uuid.uuid4().hex[:8]}"
    celery_worker = workers.start_celery("-Q", celery_queue, broker=broker, backend=REDIS_TEST_URL,
                                         env={"CELERY_DEFAULT_QUEUE": celery_queue})
    our_worker = start_ours(workers, broker, our_queue, "prefork")
    yield celery_queue, our_queue, celery_worker, our_worker
    workers.cleanup()
    for name in (celery_queue, our_queue):
        delete_queue(broker, name)


def _hostname(worker) -> str:
    return str(worker.name)


def test_a_chain_alternates_between_a_celery_worker_and_this_one(two_fleets, ours, theirs):
    celery_queue, our_queue, celery_worker, our_worker = two_fleets
    queues = [celery_queue, our_queue] * 3
    for client in (theirs, ours):
        steps = [client.hop.s([]).set(queue=queues[0])] + [client.hop.s().set(queue=q) for q in queues[1:]]
        trail = client.chain(*steps).delay().get(timeout=30)
        assert trail == [_hostname(celery_worker), _hostname(our_worker)] * 3


@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
def test_a_chord_split_between_a_celery_worker_and_this_one_completes_once(two_fleets, ours, theirs,
                                                                          tmp_path):
    celery_queue, our_queue, _, _ = two_fleets
    for client in (theirs, ours):
        for body_queue in (celery_queue, our_queue):
            runs = tmp_path / f"body-{client.app.main}-{body_queue}"
            header = [client.add.s(i, i).set(queue=celery_queue if i % 2 else our_queue) for i in range(10)]
            result = client.chord(header, client.collect.s(str(runs)).set(queue=body_queue)).delay()
            assert result.get(timeout=30) == 90
            assert _lines(runs) == [json.dumps([2 * i for i in range(10)])]
        failing = [client.add.s(1, 1).set(queue=celery_queue), client.boom.s("split").set(queue=our_queue)]
        result = client.chord(failing, client.tsum.s().set(queue=celery_queue)).delay()
        wait_for(result.ready, timeout=30, message="the split chord's body to fail")
        assert str(result.result) == f"Dependency {result.parent.results[1].id} raised Boom('split')"


# -- at least once ----------------------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_chord_body_runs_once_when_a_worker_is_killed_mid_header(workers, broker, queue, ours, theirs,
                                                                   tmp_path):
    # messages a killed worker held come back after 2 s, looked for every half second
    options = json.dumps({"visibility_timeout": 2, "unacked_restore_interval": 0.5,
                          "unacked_restore_throttle": 1})
    env = {"WORKER_BROKER_TRANSPORT_OPTIONS": options}
    for client in (theirs, ours):
        victim = start_ours(workers, broker, queue, "prefork", env=env)
        start_ours(workers, broker, queue, "prefork", env=env)
        runs = tmp_path / f"body-{client.app.main}"
        header = [client.slow_add.s(i, i, 0.3) for i in range(16)]  # acks_late
        result = client.chord(header, client.collect.s(str(runs))).delay()
        wait_for(lambda victim=victim: "slow_add" in victim.log() and " succeeded in " in victim.log(),
                 timeout=20, message="the victim to finish a header task")
        assert not result.ready()
        victim.crash()  # while it holds header tasks, some running
        assert result.get(timeout=60) == sum(2 * i for i in range(16))
        wait_for(lambda: _drained(broker, queue), timeout=30, message="every message to be done with")
        assert _lines(runs) == [json.dumps([2 * i for i in range(16)])]  # the body ran once
        # the victim held header tasks it never finished: they came back and ran elsewhere
        held = set(re.findall(r"slow_add\[([0-9a-f-]+)\] received", victim.log()))
        finished = set(re.findall(r"slow_add\[([0-9a-f-]+)\] succeeded", victim.log()))
        assert held - finished
        others = "".join(worker.log() for worker in workers.started if worker is not victim)
        # each ran on another worker, or (when the victim's pool process had stored its result just
        # before the kill, too late to log it) was found there already succeeded and not run again
        already = "ignored: it was delivered again and had succeeded already"
        assert all(f"slow_add[{task_id}] succeeded" in others or f"slow_add[{task_id}] {already}" in others
                   for task_id in held - finished)


def _drained(redis_url: str, queue: str) -> bool:
    """Nothing left to run on ``queue``: no message waiting, none held by a worker."""
    import redis

    connection = redis.Redis.from_url(redis_url)
    try:
        return connection.llen(queue) == 0 and connection.hlen("unacked") == 0
    finally:
        connection.close()


def _redelivered(redis_url: str, queue: str, task: str, task_id: str, args: list, *, callbacks=None,
                 chord=None, **headers) -> None:
    """Put a task message in ``queue`` as Redis gives back one a worker held: redelivered."""
    import base64

    import redis
    from envelopes import kombu_envelope

    embed = {"callbacks": callbacks, "errbacks": None, "chain": None, "chord": chord}
    body = json.dumps([args, {}, embed])
    headers = {"lang": "py", "task": task, "id": task_id, "retries": 0, "timelimit": [None, None],
               "root_id": task_id, "parent_id": None, "argsrepr": "()", "kwargsrepr": "{}", "origin": "test",
               "ignore_result": False, **headers}
    envelope = kombu_envelope(queue, task_id, body=base64.b64encode(body.encode()).decode(), headers=headers,
                              delivery_info={"exchange": "", "routing_key": queue, "redelivered": True})
    connection = redis.Redis.from_url(redis_url)
    connection.lpush(queue, json.dumps(envelope))
    connection.close()


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_redelivered_task_that_succeeded_sends_what_follows_only_if_it_had_not(workers, broker, queue, ours,
                                                                                tmp_path):
    from worker_core.results.meta import SUCCESS

    worker = start_ours(workers, broker, queue, "solo")
    backend = ours.app.backend
    ran, followed = tmp_path / "ran", tmp_path / "followed"
    link = [dict(ours.note_failure.s(str(followed)))]
    done_with_children, done_alone, never_done = (str(uuid.uuid4()) for _ in range(3))
    child = [[str(uuid.uuid4()), None], None]
    backend.store_result(done_with_children, "stored", SUCCESS, None, {"children": [child]})
    backend.store_result(done_alone, "stored", SUCCESS, None, {})
    for task_id in (done_with_children, done_alone, never_done):
        _redelivered(broker, queue, "apps.basic.record", task_id, [str(ran), task_id], callbacks=link)
    wait_for(lambda: len(_lines(followed)) == 2, timeout=20, message="the callbacks")
    worker.wait_log(f"apps.basic.record[{done_with_children}] ignored")
    # neither that had succeeded ran again; only the one without children sent its callback again
    assert _lines(ran) == [never_done]
    assert sorted(_lines(followed)) == sorted(["stored", never_done])
    assert ours.app.AsyncResult(done_with_children).get(timeout=5) == "stored"


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_chord_header_task_delivered_again_is_counted_once(workers, broker, queue, ours, tmp_path):
    from worker_core.results.meta import SUCCESS

    worker = start_ours(workers, broker, queue, "solo")
    backend = ours.app.backend
    runs = tmp_path / "body"
    group_id, first, second = (str(uuid.uuid4()) for _ in range(3))
    body = ours.collect.s(str(runs))
    body.freeze()
    backend.set_chord_size(group_id, 2)
    # the second header task succeeded and was counted, and its worker died before acknowledging it
    backend.store_result(second, 5, SUCCESS, None, {})
    backend.count_chord_part(group_id, second, 1, SUCCESS, 5, claim_seconds=30)
    header = {"group": group_id, "group_index": 1}
    _redelivered(broker, queue, "apps.basic.add", second, [2, 3], chord=dict(body), **header)
    worker.wait_log(f"apps.basic.add[{second}] ignored")
    assert not ours.app.AsyncResult(body.id).ready()  # counted once: one of two
    ours.app.send_task("apps.basic.add", (1, 1), task_id=first, group_id=group_id, group_index=0, chord=body)
    assert ours.app.AsyncResult(body.id).get(timeout=30) == 7
    _redelivered(broker, queue, "apps.basic.add", second, [2, 3], chord=dict(body), **header)  # once more
    worker.wait_log(f"apps.basic.add[{second}] ignored")
    wait_for(lambda: worker.log().count(f"apps.basic.add[{second}] ignored") == 2, timeout=20,
             message="the second copy")
    assert _lines(runs) == ["[2, 5]"]


# -- chords joined by polling ----------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_celery_chord_unlock_sent_by_a_celery_client_joins_a_chord_here(workers, broker, queue, theirs):
    start_ours(workers, broker, queue, "solo")
    t = theirs
    for members, expected in (([t.add.s(1, 1), t.slow_add.s(2, 2, 0.5)], 6),
                              ([t.add.s(1, 1), t.boom.s("polled")], None)):
        header = t.group(members).apply_async()
        body = t.tsum.s()
        body_result = body.freeze()
        header_tuples = [r.as_tuple() for r in header.results]
        t.app.send_task("celery.chord_unlock", (header.id, body),
                        {"interval": 0.1, "max_retries": None, "result": header_tuples}, countdown=0.1)
        wait_for(body_result.ready, timeout=30, message="the body polled for")
        if expected is not None:
            assert body_result.get(timeout=5) == expected
        else:
            assert isinstance(body_result.result, celery.exceptions.ChordError)
            assert str(body_result.result) == f"Dependency {header.results[1].id} raised Boom('polled')"


POLLING_BACKEND = '''
from worker_core.results.embedded import EmbeddedBackend


class PollingBackend:
    """Keeps results in the embedded file and does not count chords: celery.chord_unlock joins."""

    def __init__(self, url, settings):
        self._inner = EmbeddedBackend("embedded://" + url.partition("://")[2], settings)

    def store_result(self, task_id, result, state, traceback=None, request=None):
        self._inner.store_result(task_id, result, state, traceback, request)

    def get_task_meta(self, task_id):
        return self._inner.get_task_meta(task_id)

    def wait_for(self, task_id, timeout=None, interval=0.5):
        return self._inner.wait_for(task_id, timeout, interval)

    def on_task_call(self, task_id):
        pass

    def forget(self, task_id):
        self._inner.forget(task_id)

    def close(self):
        self._inner.close()
'''


def test_a_chord_on_a_backend_that_does_not_count_is_joined_by_chord_unlock(workers, site, tmp_path):
    import os

    site.add("polling-backend", {"worker.result_backends": {"polling": "polling_backend:PollingBackend"}},
             {"polling_backend": POLLING_BACKEND})
    broker, backend = f"embedded://{tmp_path}/queue.db", f"polling://{tmp_path}/results.db"
    path = os.pathsep.join(filter(None, [str(site.root), os.environ.get("PYTHONPATH")]))
    workers.start(pool="solo", broker=broker, backend=backend, env={"PYTHONPATH": path})
    from worker_core import App, canvas

    client = App("polling", broker=broker, backend=backend)  # its plugins read after the site's
    add, tsum, boom = (client.signature(f"apps.basic.{name}") for name in ("add", "tsum", "boom"))
    try:
        sent = canvas.chord([add.clone((1, 1)), add.clone((2, 2))], tsum).delay()
        assert sent.get(timeout=30) == 6
        failing = canvas.chord([add.clone((1, 1)), boom.clone(("unlocked",))], tsum).delay()
        wait_for(failing.ready, timeout=30, message="the body polled for")
        assert isinstance(failing.result, ChordError)
        assert str(failing.result) == f"Dependency {failing.parent.results[1].id} raised Boom('unlocked')"
    finally:
        client.close()


# -- what this worker cannot honour, and what it tells ----------------------------------------------


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_canvas_this_worker_cannot_honour_fails_the_task_with_the_reason(workers, broker, queue, ours,
                                                                          theirs, tmp_path):
    worker = start_ours(workers, broker, queue, "solo")
    ran = tmp_path / "ran"
    spiral = {"task": "apps.basic.mul", "args": [], "kwargs": {}, "options": {}, "subtask_type": "spiral",
              "immutable": False}
    cases = [
        (ours.app.send_task("apps.basic.record", (str(ran), "x"), chain=[spiral]),
         r"the embed's 'chain' holds a malformed signature: unknown signature kind subtask_type='spiral'"),
        (theirs.app.send_task("apps.basic.record", (str(ran), "x"), link=[{"args": "oops"}]),
         r"the embed's 'callbacks' holds a malformed signature: a signature's dict needs a task name "
         r"under 'task'"),
        (ours.app.send_task("apps.basic.record", (str(ran), "x"), chain={"not": "a list"}),
         r"the embed's 'chain' must be a list of signatures, last step first"),
    ]
    for result, reason in cases:
        with pytest.raises(CanvasError, match=reason):
            result.get(timeout=30)
        worker.wait_log(f"Task apps.basic.record[{result.id}] not run: its message carries a canvas this "
                        f"worker cannot honour")
    assert _lines(ran) == []


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_next_step_that_cannot_be_sent_fails_the_task_and_the_rest_of_its_chain(workers, broker, queue,
                                                                                  ours, tmp_path):
    worker = start_ours(workers, broker, queue, "prefork")
    errbacks = tmp_path / "errbacks"
    unsendable = ours.app.signature("apps.basic.unsendable")
    errback = ours.note_failure.s(str(errbacks))
    result = (unsendable | ours.echo.s() | ours.echo.s()).apply_async(link_error=errback)
    with pytest.raises(CanvasError, match="the task returned but what follows it could not be sent: "):
        result.get(timeout=30)
    steps = parents(result)
    wait_for(lambda: all(step.ready() for step in steps), timeout=20, message="every step")
    assert [step.state for step in steps] == ["FAILURE"] * 3
    wait_for(lambda: _lines(errbacks), timeout=20, message="the errback")
    assert _lines(errbacks) == [steps[-1].id]
    worker.wait_log(f"Task apps.basic.unsendable[{steps[-1].id}]: the task returned but what follows it "
                    f"could not be sent")


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_task_failed_or_expired_in_the_main_process_fails_its_workflow_there(workers, broker, queue, ours,
                                                                               theirs, tmp_path):
    from datetime import datetime, timedelta, timezone

    start_ours(workers, broker, queue, "prefork")
    for client in (theirs, ours):
        errbacks = tmp_path / f"errbacks-{client.app.main}"
        limited = client.app.signature("apps.basic.hard_limited", (2,))  # killed after 0.5 s
        chained = (limited | client.add.si(1, 1)).apply_async(link_error=client.note_failure.s(str(errbacks)))
        past = datetime.now(timezone.utc) - timedelta(seconds=1)
        header = [client.add.s(1, 1), client.add.s(2, 2).set(expires=past)]
        expired = client.chord(header, client.tsum.s()).delay()
        wait_for(chained.ready, timeout=30, message="the chain after a task over its time limit")
        assert chained.state == chained.parent.state == "FAILURE"
        wait_for(lambda path=errbacks: _lines(path), timeout=20, message="the errback of the limited task")
        assert _lines(errbacks) == [chained.parent.id]
        wait_for(expired.ready, timeout=30, message="the chord with an expired header task")
        assert str(expired.result) == (f"Dependency {expired.parent.results[1].id} raised "
                                       f"TaskRevokedError('expired')")


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_inspect_registered_lists_the_built_in_tasks_when_asked_as_celerys_does(workers, broker, queue,
                                                                                 theirs):
    worker = start_ours(workers, broker, queue, "solo")
    name = _hostname(worker)
    inspect = theirs.app.control.inspect(timeout=3, destination=[name])
    plain = inspect.registered()[name]
    assert "apps.basic.add" in plain and not [task for task in plain if task.startswith("celery.")]
    with_builtins = inspect._request("registered", builtins=True)[name]
    assert {"celery.map", "celery.starmap", "celery.chunks", "celery.chord_unlock", "celery.backend_cleanup",
            "celery.accumulate", "celery.group", "celery.chain", "celery.chord"} <= set(with_builtins)

"""The Redis result backend against a real Redis and a real Celery: Celery's values, expiry, the
PUBLISH that wakes Celery's client and ours, SUCCESS kept, threads, forks and reconnects."""

from __future__ import annotations

import json
import multiprocessing
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from conftest import REDIS_PORT, redis_db, require_server
from faults import TcpProxy
from workers import wait_for

from worker_core.app.settings import Settings
from worker_core.exceptions import ConfigurationError, ResultTimeout
from worker_core.results.meta import encode_exception
from worker_transport_redis import RedisBackend

pytestmark = pytest.mark.redis

DB = 10  # this file's database on the shared Redis; keys are per-test task ids
URL = redis_db(DB)


@pytest.fixture
def raw() -> Iterator[redis.Redis]:
    require_server(REDIS_PORT, "Redis")
    client = redis.Redis.from_url(URL)
    yield client
    client.close()


@pytest.fixture
def task_ids(raw: redis.Redis) -> Iterator[list[str]]:
    """Fresh task ids; their keys (with or without the test prefix) are deleted afterwards."""
    ids = [str(uuid.uuid4()) for _ in range(40)]
    yield ids
    for task_id in ids:
        raw.delete(f"celery-task-meta-{task_id}", f"app_celery-task-meta-{task_id}")


def backend(url: str = URL, **settings: Any) -> RedisBackend:
    return RedisBackend(url, Settings(**settings))


def celery_backend(**conf: Any) -> Any:
    from celery import Celery
    from celery.backends.redis import RedisBackend as CeleryRedisBackend

    app = Celery("results", broker="memory://", backend=URL)
    app.conf.update(**conf)
    return CeleryRedisBackend(app=app, url=URL)


def stored(raw: redis.Redis, key: str) -> dict[str, Any]:
    value = raw.get(key)
    assert value is not None, f"{key} is not stored"
    return json.loads(value)


# -- format ----------------------------------------------------------------------------------------


def test_a_success_is_stored_exactly_as_celerys_redis_backend_stores_it(raw: redis.Redis,
                                                                        task_ids: list[str]) -> None:
    ours, theirs = task_ids[:2]
    backend().store_result(ours, {"sum": 7, "items": [1, 2]}, "SUCCESS",
                           request={"group": "g-1", "parent_id": "p-1"})
    celery_backend().store_result(theirs, {"sum": 7, "items": [1, 2]}, "SUCCESS",
                                  request=SimpleNamespace(children=[], group="g-1", parent_id="p-1"))
    mine, celerys = stored(raw, f"celery-task-meta-{ours}"), stored(raw, f"celery-task-meta-{theirs}")
    assert list(mine) == list(celerys)
    assert {**mine, "task_id": "", "date_done": ""} == {**celerys, "task_id": "", "date_done": ""}
    assert mine["date_done"].endswith("+00:00") and len(mine["date_done"]) == len(celerys["date_done"])


def test_a_failure_is_stored_with_celerys_exception_encoding(raw: redis.Redis, task_ids: list[str]) -> None:
    ours, theirs = task_ids[:2]
    backend().store_result(ours, encode_exception(ValueError("bad things", 42)), "FAILURE", "Traceback...")
    celery_backend().store_result(theirs, ValueError("bad things", 42), "FAILURE", traceback="Traceback...",
                                  request=SimpleNamespace(children=[], group=None, parent_id=None))
    mine, celerys = stored(raw, f"celery-task-meta-{ours}"), stored(raw, f"celery-task-meta-{theirs}")
    assert mine["result"] == celerys["result"] == {
        "exc_type": "ValueError", "exc_message": ["bad things", 42], "exc_module": "builtins"}
    assert {**mine, "task_id": "", "date_done": ""} == {**celerys, "task_id": "", "date_done": ""}


def test_celerys_client_reads_what_we_store_and_we_read_what_celery_stores(task_ids: list[str]) -> None:
    ours, theirs = task_ids[:2]
    backend().store_result(ours, encode_exception(KeyError("k")), "FAILURE", "tb")
    celery = celery_backend()
    meta = celery.get_task_meta(ours)
    assert meta["status"] == "FAILURE" and isinstance(meta["result"], KeyError)
    celery.store_result(theirs, [1, "two"], "SUCCESS")
    assert backend().get_task_meta(theirs)["result"] == [1, "two"]


def test_the_global_keyprefix_is_joined_as_celery_joins_it(raw: redis.Redis, task_ids: list[str]) -> None:
    options = {"global_keyprefix": "app"}
    backend(result_backend_transport_options=options).store_result(task_ids[0], 1, "SUCCESS")
    celery_backend(result_backend_transport_options=options).store_result(task_ids[1], 1, "SUCCESS")
    assert raw.exists(f"app_celery-task-meta-{task_ids[0]}", f"app_celery-task-meta-{task_ids[1]}") == 2


def test_results_expire_after_result_expires(raw: redis.Redis, task_ids: list[str]) -> None:
    backend().store_result(task_ids[0], 1, "SUCCESS")
    assert 86390 < raw.ttl(f"celery-task-meta-{task_ids[0]}") <= 86400
    backend(result_expires=2.5).store_result(task_ids[1], 1, "SUCCESS")
    assert 2000 < raw.pttl(f"celery-task-meta-{task_ids[1]}") <= 2500
    backend(result_expires=None).store_result(task_ids[2], 1, "SUCCESS")
    assert raw.ttl(f"celery-task-meta-{task_ids[2]}") == -1


def test_a_stored_success_is_never_overwritten(task_ids: list[str]) -> None:
    results = backend()
    results.store_result(task_ids[0], "first", "SUCCESS")
    results.store_result(task_ids[0], encode_exception(RuntimeError("late duplicate")), "FAILURE")
    results.store_result(task_ids[0], "second", "SUCCESS")
    assert results.get_task_meta(task_ids[0])["result"] == "first"
    results.store_result(task_ids[1], None, "STARTED")
    results.store_result(task_ids[1], "done", "SUCCESS")
    assert results.get_task_meta(task_ids[1])["status"] == "SUCCESS"


def test_an_unknown_task_is_pending_and_forget_deletes_a_result(task_ids: list[str]) -> None:
    results = backend()
    assert results.get_task_meta(task_ids[0])["status"] == "PENDING"
    results.store_result(task_ids[0], 3, "SUCCESS")
    results.forget(task_ids[0])
    assert results.get_task_meta(task_ids[0]) == {"status": "PENDING", "result": None, "traceback": None,
                                                  "children": [], "date_done": None, "task_id": task_ids[0]}


@pytest.mark.parametrize(("url", "options", "expected"), [
    ("redis://127.0.0.1:6379/results", {}, "database 'results'"),
    ("mongodb://127.0.0.1", {}, "not a Redis URL"),
    ("sentinel://127.0.0.1:26379", {}, "master_name"),
    ("redis://127.0.0.1:6379/0", {"global_key_prefix": "x"}, "Did you mean 'global_keyprefix'?"),
    ("redis://127.0.0.1:6379/0", {"retry_policy": {"tries": 3}}, "retry_policy"),
])
def test_bad_backend_urls_and_options_are_refused(url: str, options: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        RedisBackend(url, Settings(result_backend_transport_options=options))


# -- waiting -----------------------------------------------------------------------------------------


def store_later(task_id: str, delay: float, value: Any = 42, url: str = URL) -> threading.Thread:
    def store() -> None:
        time.sleep(delay)  # stored a while later: the waiting under test
        backend(url).store_result(task_id, value, "SUCCESS")

    thread = threading.Thread(target=store)
    thread.start()
    return thread


def test_our_publish_wakes_a_waiting_celery_client(task_ids: list[str]) -> None:
    from celery import Celery

    app = Celery("client", broker="memory://", backend=URL)
    thread = store_later(task_ids[0], 0.3, "from us")
    started = time.monotonic()
    assert app.AsyncResult(task_ids[0]).get(timeout=5, interval=5) == "from us"
    assert time.monotonic() - started < 1.0  # woken by the PUBLISH, not by polling every 5 s
    thread.join()
    app.close()


def test_wait_for_wakes_within_milliseconds_of_the_store_without_polling(task_ids: list[str]) -> None:
    results = backend()
    results.on_task_call(task_ids[0])
    stored_at: list[float] = []

    def store() -> None:
        time.sleep(0.3)  # stored a while later: the waiting under test
        stored_at.append(time.monotonic())
        backend().store_result(task_ids[0], "done", "SUCCESS")

    thread = threading.Thread(target=store)
    thread.start()
    meta = results.wait_for(task_ids[0], timeout=5, interval=10)
    woke = time.monotonic()
    thread.join()
    assert meta["result"] == "done"
    assert woke - stored_at[0] < 0.05


def test_wait_for_returns_a_result_stored_before_it_subscribed(task_ids: list[str]) -> None:
    backend().store_result(task_ids[0], "early", "SUCCESS")
    started = time.monotonic()
    assert backend().wait_for(task_ids[0], timeout=5)["result"] == "early"
    assert time.monotonic() - started < 0.5


def test_wait_for_ignores_unready_states_and_times_out(task_ids: list[str]) -> None:
    results = backend()
    results.store_result(task_ids[0], None, "STARTED")
    started = time.monotonic()
    with pytest.raises(ResultTimeout, match=r"within 0.3s \(state: STARTED\)"):
        results.wait_for(task_ids[0], timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 1.0


def test_threads_wait_for_different_results_at_once(task_ids: list[str]) -> None:
    results = backend()
    ids = task_ids[:20]
    answers: dict[str, Any] = {}
    errors: list[BaseException] = []

    def wait(task_id: str) -> None:
        try:
            answers[task_id] = results.wait_for(task_id, timeout=10)["result"]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(task_id,)) for task_id in ids]
    for thread in threads:
        thread.start()
    writer = backend()
    for number, task_id in enumerate(reversed(ids)):
        writer.store_result(task_id, number, "SUCCESS")
    for thread in threads:
        thread.join(timeout=15)
    assert not errors
    assert answers == {task_id: number for number, task_id in enumerate(reversed(ids))}


def _child_stores(url: str, task_id: str) -> None:
    _shared.store_result(task_id, "from the child", "SUCCESS")
    _shared.wait_for(task_id, timeout=5)


_shared: RedisBackend


def test_a_forked_child_stores_on_its_own_connection_and_the_parent_keeps_working(
        task_ids: list[str]) -> None:
    global _shared
    _shared = backend()
    _shared.store_result(task_ids[0], "from the parent", "SUCCESS")  # the parent is connected
    _shared.on_task_call(task_ids[1])
    child = multiprocessing.get_context("fork").Process(target=_child_stores, args=(URL, task_ids[1]))
    child.start()
    assert _shared.wait_for(task_ids[1], timeout=10)["result"] == "from the child"
    child.join(timeout=10)
    assert child.exitcode == 0
    assert _shared.get_task_meta(task_ids[0])["result"] == "from the parent"
    _shared.close()


def _inside(thread: threading.Thread, function: str, package: str) -> bool:
    """Whether ``thread`` is running ``function`` of ``package`` now (anywhere in its stack)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == function and package in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def test_wait_for_reads_the_result_again_after_its_connection_comes_back(raw: redis.Redis,
                                                                          task_ids: list[str]) -> None:
    proxy = TcpProxy("127.0.0.1", REDIS_PORT)
    try:
        results = backend(f"redis://127.0.0.1:{proxy.port}/{DB}")
        results.on_task_call(task_ids[0])
        waited: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: waited.update(results.wait_for(task_ids[0], timeout=10)))
        thread.start()
        wait_for(lambda: _inside(thread, "wait_for", "worker_transport_redis"), message="the wait to begin")
        proxy.cut()  # the subscriber connection drops; the PUBLISH below reaches nobody
        backend().store_result(task_ids[0], "while you were away", "SUCCESS")
        time.sleep(0.3)  # the behaviour under test: the connection stays down a while
        proxy.restore()
        thread.join(timeout=10)
    finally:
        proxy.close()
    assert waited.get("result") == "while you were away"


def test_a_result_stored_before_the_server_takes_a_waits_subscription_is_still_found(
        task_ids: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A wait on a task this client did not send subscribes then reads the key at once; redis-py
    # does not wait for the subscription's confirmation, so the server may take the read first
    # and the PUBLISH of a result stored in between reaches nobody. The proxy holds the SUBSCRIBE
    # back until the read found nothing and the result was stored.
    key = f"celery-task-meta-{task_ids[0]}".encode()
    stored = threading.Event()

    def hold_the_subscription(data: bytes) -> None:
        if b"SUBSCRIBE" in data and key in data:
            stored.wait(10)

    proxy = TcpProxy("127.0.0.1", REDIS_PORT, client_data=hold_the_subscription)
    try:
        results = backend(f"redis://127.0.0.1:{proxy.port}/{DB}")
        first_read = threading.Event()
        read = results._read

        def read_then_tell(task_id: str) -> Any:
            meta = read(task_id)
            first_read.set()
            return meta

        monkeypatch.setattr(results, "_read", read_then_tell)
        waited: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: waited.update(results.wait_for(task_ids[0], timeout=10)))
        thread.start()
        assert first_read.wait(10)
        backend().store_result(task_ids[0], "stored meanwhile", "SUCCESS")  # nobody subscribed yet
        stored.set()
        thread.join(timeout=15)
        results.close()
    finally:
        stored.set()
        proxy.close()
    assert waited.get("result") == "stored meanwhile"


def test_subscriptions_for_results_nobody_waits_for_are_bounded(task_ids: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from worker_transport_redis import listener

    monkeypatch.setattr(listener, "MAX_EARLY", 3)
    results = backend()
    for task_id in task_ids[:5]:
        results.on_task_call(task_id)
    subscribed = results._current().listener._subscribed
    assert subscribed == {f"celery-task-meta-{task_id}" for task_id in task_ids[2:5]}
    store_later(task_ids[0], 0.2, "dropped early, still found").join()
    assert results.wait_for(task_ids[0], timeout=5)["result"] == "dropped early, still found"


# -- groups and chords -----------------------------------------------------------------------------


@pytest.fixture
def group_ids(raw: redis.Redis) -> Iterator[list[str]]:
    """Fresh group ids; their keys (and a chord's join keys) are deleted afterwards."""
    ids = [str(uuid.uuid4()) for _ in range(4)]
    yield ids
    for group_id in ids:
        raw.delete(*(f"{prefix}celery-taskset-meta-{group_id}{suffix}" for prefix in ("", "app_")
                     for suffix in ("", ".s", ".c")))


def _celery_group(app: Any, group_id: str, task_ids: list[str], nested: bool = False) -> Any:
    from celery.result import AsyncResult, GroupResult

    members: list[Any] = [AsyncResult(task_id, app=app) for task_id in task_ids[:2]]
    if nested:
        members.append(GroupResult(task_ids[3], [AsyncResult(task_ids[2], app=app)], app=app))
    return GroupResult(group_id, members, parent=AsyncResult(task_ids[4], app=app), app=app)


def test_a_group_is_saved_exactly_as_celery_saves_it_and_each_restores_the_others(
        raw: redis.Redis, group_ids: list[str], task_ids: list[str]) -> None:
    ours, theirs = group_ids[:2]
    celery = celery_backend()
    ours_tuple = _celery_group(celery.app, ours, task_ids, nested=True).as_tuple()
    pubsub = raw.pubsub()
    pubsub.subscribe(f"celery-taskset-meta-{ours}")
    pubsub.get_message(timeout=1)  # the subscription's confirmation
    backend(result_expires=600).save_group(ours, ours_tuple)
    celery.save_group(theirs, _celery_group(celery.app, theirs, task_ids, nested=True))
    mine, celerys = raw.get(f"celery-taskset-meta-{ours}"), raw.get(f"celery-taskset-meta-{theirs}")
    assert mine is not None and celerys is not None
    assert json.loads(mine.replace(ours.encode(), b"<id>")) == \
        json.loads(celerys.replace(theirs.encode(), b"<id>"))
    assert 590 < raw.ttl(f"celery-taskset-meta-{ours}") <= 600
    published = pubsub.get_message(timeout=2)
    pubsub.close()
    assert published is not None and published["data"] == mine
    # each reads the other's
    restored = celery.restore_group(ours)
    assert restored.id == ours and [r.id for r in restored.results[:2]] == task_ids[:2]
    assert restored.results[2].results[0].id == task_ids[2] and restored.parent.id == task_ids[4]
    assert backend().restore_group(theirs) == json.loads(celerys)["result"]
    backend().delete_group(theirs)
    assert celery.restore_group(theirs, cache=False) is None and backend().restore_group(theirs) is None


def test_group_keys_take_the_global_keyprefix_as_celerys_do(raw: redis.Redis, group_ids: list[str]) -> None:
    options = {"global_keyprefix": "app"}
    backend(result_backend_transport_options=options).save_group(group_ids[0], [[group_ids[0], None], []])
    backend(result_backend_transport_options=options).set_chord_size(group_ids[0], 3)
    assert raw.exists(f"app_celery-taskset-meta-{group_ids[0]}") and \
        raw.get(f"app_celery-taskset-meta-{group_ids[0]}.s") == b"3"


def test_a_chords_size_is_recorded_as_celerys_client_records_it(raw: redis.Redis,
                                                                group_ids: list[str]) -> None:
    ours, theirs = group_ids[:2]
    for group_id in (ours, theirs):
        raw.set(f"celery-taskset-meta-{group_id}.c", "done")  # a previous run's claim
    backend(result_expires=600, result_chord_expires=300).set_chord_size(ours, 4)
    celery_backend(result_expires=600, result_chord_expires=300).set_chord_size(theirs, 4)
    for group_id in (ours, theirs):
        assert raw.get(f"celery-taskset-meta-{group_id}.s") == b"4"
        assert 290 < raw.ttl(f"celery-taskset-meta-{group_id}.s") <= 300
        assert not raw.exists(f"celery-taskset-meta-{group_id}.c")


def test_a_chord_header_holding_a_group_is_saved_as_celerys_client_saves_it(
        raw: redis.Redis, group_ids: list[str], task_ids: list[str]) -> None:
    ours, theirs, plain = group_ids[:3]
    celery = celery_backend()
    mine = backend()
    mine.apply_chord(plain, _celery_group(celery.app, plain, task_ids).as_tuple())
    assert not raw.exists(f"celery-taskset-meta-{plain}")  # tasks only: nothing to keep
    mine.apply_chord(ours, _celery_group(celery.app, ours, task_ids, nested=True).as_tuple())
    header = _celery_group(celery.app, theirs, task_ids, nested=True)
    celery.apply_chord((header.id, header.results), None)
    stored_ours = raw.get(f"celery-taskset-meta-{ours}")
    stored_theirs = raw.get(f"celery-taskset-meta-{theirs}")
    assert stored_ours is not None and stored_theirs is not None
    # Celery's header has no parent here: compare the members
    assert json.loads(stored_ours)["result"][1] == json.loads(stored_theirs)["result"][1]
    assert raw.ttl(f"celery-taskset-meta-{ours}") == raw.ttl(f"celery-taskset-meta-{theirs}") or \
        abs(raw.ttl(f"celery-taskset-meta-{ours}") - raw.ttl(f"celery-taskset-meta-{theirs}")) <= 1

"""Results stored in Celery's result serializers (``result_serializer``: json, msgpack, yaml,
pickle): told apart when read, refused when not accepted, and, with the setting, stored so by a
real worker for a Celery client set the same way and for this project's client. (Each backend
against the contract: ``test_result_backend_contract.py``; a task's own serializer and Celery
clients: ``test_task_api.py``; refusals at start: ``test_bad_configuration.py``.)"""

from __future__ import annotations

import pickle
import uuid

import pytest
from apps import taskapi
from conftest import empty_redis, redis_db

from worker_core.exceptions import ResultDecodeError
from worker_core.results.codec import ResultCodec

RESULTS_URL = redis_db(6)
META = {"status": "SUCCESS", "result": {"n": [1, 2.5, None, "x"]}, "traceback": None, "children": [],
        "date_done": "2024-05-17T12:30:00+00:00", "task_id": "t-1"}


@pytest.mark.parametrize("serializer", ["json", "msgpack", "yaml", "pickle"])
def test_a_meta_stored_in_each_serializer_reads_back_through_a_codec_of_any_serializer(
        serializer: str) -> None:
    writer = ResultCodec(serializer, ["json", "msgpack", "yaml", "pickle"])
    payload = writer.encode(dict(META))
    reader = ResultCodec("json", ["json", "msgpack", "yaml", "pickle"])
    assert reader.decode(payload, "the result") == META
    assert reader.decode(reader.encode(dict(META), serializer), "the result") == META


@pytest.mark.parametrize(("serializer", "advice"), [
    ("msgpack", "add 'msgpack' to the result_accept_content setting to read it"),
    ("yaml", "add 'yaml' to the result_accept_content setting to read it"),
    ("pickle", "reading pickle runs the code it holds: add 'pickle' to result_accept_content only when"),
])
def test_a_result_in_a_format_not_accepted_is_refused_saying_what_to_accept(serializer: str,
                                                                            advice: str) -> None:
    payload = ResultCodec(serializer, [serializer]).encode(dict(META))
    with pytest.raises(ResultDecodeError) as refused:
        ResultCodec("json", ["json"]).decode(payload, "the stored result of task t-1")
    assert str(refused.value).startswith(f"the stored result of task t-1 is stored in {serializer}, which "
                                         f"this app does not accept for results (accepted: json); ")
    assert advice in str(refused.value)


def test_a_result_that_is_no_meta_or_compressed_is_refused_saying_so() -> None:
    codec = ResultCodec("json", ["json", "pickle"])
    with pytest.raises(ResultDecodeError, match="the result is not Celery's format: it holds a list"):
        codec.decode(b"[1, 2]", "the result")
    with pytest.raises(ResultDecodeError, match="the result cannot be read as json"):
        codec.decode(b"{not json", "the result")
    with pytest.raises(ResultDecodeError, match=r"compressed \(Celery's result_compression\)"):
        codec.decode(b"\x00celery-compressed\x00application/x-gzip\x00...", "the result")
    assert codec.decode(pickle.dumps(META, protocol=2), "the result") == META


def test_with_the_result_serializer_setting_a_celery_client_set_the_same_and_ours_read_the_results(
        workers) -> None:
    from celery import Celery

    url = empty_redis(RESULTS_URL)
    queue = f"serializers-{uuid.uuid4().hex[:8]}"
    worker = workers.start("-Q", queue, "-c", "1", app="apps.taskapi", pool="prefork", broker=url,
                           backend=url, env={"WORKER_RESULT_SERIALIZER": "yaml",
                                             # the app has a task storing pickle: accepted, or refused
                                             "WORKER_RESULT_ACCEPT_CONTENT": "json,yaml,pickle"})
    client = Celery("serializers-client", broker=url, backend=url)
    client.conf.update(broker_connection_retry_on_startup=True, result_serializer="yaml",
                       result_accept_content=["yaml"])
    try:
        expected = {"serializer": "setting", "items": [1, 2.5, None, "x"]}
        assert client.send_task("apps.taskapi.plain", queue=queue).get(timeout=20) == expected
        with pytest.raises(taskapi.Refused, match="plain"):
            client.send_task("apps.taskapi.plain", (True,), queue=queue).get(timeout=20)
        expired = client.send_task("apps.taskapi.plain", queue=queue, countdown=1, expires=0.2)
        with pytest.raises(Exception) as revoked:  # stored by the worker's main process, in yaml too
            expired.get(timeout=20)
        assert type(revoked.value).__name__ == "TaskRevokedError"
    finally:
        client.close()
    taskapi.app.conf.update(broker_url=url, result_backend=url, result_accept_content=["json", "yaml"])
    try:
        assert taskapi.plain.apply_async(queue=queue).get(timeout=20) == expected
    finally:
        taskapi.app.close()
    assert "could not store state" not in worker.log()

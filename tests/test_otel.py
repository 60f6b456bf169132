"""OpenTelemetry (worker-otel): one trace from a client's publish through this worker to a span
inside the task, for this project's App and for a Celery app, in the prefork and threads pools;
from a Celery client instrumented with opentelemetry-instrumentation-celery and from this
project's client through a chain, a chord and a retry; the spans of recycled prefork children
exported; the attributes those of Celery's instrumentation. The worker's spans go through the
SDK's in-memory exporter, which also writes them to a file per process (``otel_spans``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REDIS_PORT, empty_redis, redis_db, require_server
from otel_spans import exporter_site, read_spans, span_record
from workers import TESTS, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def spans_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "spans"
    folder.mkdir()
    return folder


@pytest.fixture
def brokers() -> tuple[str, str]:
    require_server(REDIS_PORT, "Redis")
    return empty_redis(redis_db(5)), empty_redis(redis_db(6))


def otel_env(tmp_path: Path, spans_dir: Path, broker: str, results: str,
             delay_ms: int = 50) -> dict[str, str]:
    site = exporter_site(tmp_path / "site")
    return {"PYTHONPATH": f"{site}{os.pathsep}{TESTS}", "OTEL_TRACES_EXPORTER": "jsonl",
            "OTEL_BSP_SCHEDULE_DELAY": str(delay_ms), "WORKER_TEST_SPANS": str(spans_dir),
            "OTEL_SERVICE_NAME": "traced-worker", "CELERY_BROKER_URL": broker,
            "CELERY_RESULT_BACKEND": results, "WORKER_RESULT_BACKEND": results}


@pytest.fixture
def client_spans() -> Iterator[Any]:
    """The test process's tracer provider, with the SDK's in-memory exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def celery_client(brokers, client_spans) -> Iterator[Any]:
    """A Celery client instrumented with opentelemetry-instrumentation-celery."""
    from celery import Celery
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    broker, results = brokers
    provider, _exporter = client_spans
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    client = Celery("traced-client", broker=broker, backend=results)
    yield client
    instrumentor.uninstrument()
    client.close()


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"] == name]


def wait_for_spans(spans_dir: Path, expected: dict[str, int], timeout: float = 30) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        nonlocal found
        found = read_spans(spans_dir)
        return all(len(by_name(found, name)) >= count for name, count in expected.items())

    try:
        wait_for(arrived, timeout=timeout)
    except AssertionError:
        names = [span["name"] for span in found]
        raise AssertionError(f"not every span of {expected} was exported: {names}") from None
    return found


def producer(exporter: Any, name: str) -> Any:
    published = [span for span in exporter.get_finished_spans() if span.name == name]
    assert len(published) == 1, [span.name for span in exporter.get_finished_spans()]
    return published[0]


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_celery_clients_trace_runs_through_an_app_task_to_a_span_inside_it(
        workers, tmp_path, spans_dir, brokers, celery_client, client_spans, pool):
    broker, results = brokers
    worker = workers.start("-c", "1", "--otel", app="apps.otel_app", pool=pool, broker=broker,
                           env=otel_env(tmp_path, spans_dir, broker, results))
    result = celery_client.send_task("apps.otel_app.add", (2, 3))
    assert result.get(timeout=20) == 5
    spans = wait_for_spans(spans_dir, {"run/apps.otel_app.add": 1, "add-inside": 1})
    publish = producer(client_spans[1], "apply_async/apps.otel_app.add")
    (run,) = by_name(spans, "run/apps.otel_app.add")
    (inside,) = by_name(spans, "add-inside")
    trace_id = format(publish.context.trace_id, "032x")
    assert run["trace_id"] == inside["trace_id"] == trace_id  # one trace, client to task
    assert run["parent_id"] == format(publish.context.span_id, "016x")  # parented by the publish
    assert inside["parent_id"] == run["span_id"]  # the task's own span is the run's child
    assert run["kind"] == "CONSUMER" and run["status"] == "UNSET"
    attributes = run["attributes"]
    assert attributes["celery.action"] == "run" and attributes["celery.state"] == "SUCCESS"
    assert attributes["celery.task_name"] == "apps.otel_app.add"
    assert attributes["messaging.message.id"] == result.id
    assert attributes["messaging.destination"] == "celery"
    assert attributes["celery.hostname"]
    if pool == "prefork":
        assert run["pid"] != worker.pid  # exported by the child that ran it
    assert worker.stop() == 0


def test_this_projects_client_carries_one_trace_through_a_chain_a_chord_and_a_retry(
        workers, tmp_path, spans_dir, brokers, client_spans):
    import worker_otel
    from apps import otel_app

    from worker_core import chain, chord

    broker, results = brokers
    provider, exporter = client_spans
    workers.start("-c", "2", "--otel", app="apps.otel_app", pool="prefork", broker=broker,
                  env=otel_env(tmp_path, spans_dir, broker, results))
    otel_app.app.conf.update(broker_url=broker, result_backend=results)
    worker_otel.instrument(otel_app.app, tracer_provider=provider)
    worker_otel.instrument(otel_app.app, tracer_provider=provider)  # again: nothing more
    tracer = provider.get_tracer("test")
    try:
        with tracer.start_as_current_span("client-work") as work:
            assert chain(otel_app.add.s(1, 2), otel_app.add.s(3))().get(timeout=30) == 6
            header = [otel_app.add.s(1, 1), otel_app.add.s(2, 2)]
            assert chord(header, otel_app.tsum.s())().get(timeout=30) == 6
            assert otel_app.flaky.delay().get(timeout=30) == 1
    finally:
        worker_otel.uninstrument(otel_app.app)
        otel_app.app.close()
    trace_id = format(work.get_span_context().trace_id, "032x")
    client = [span_record(span) for span in exporter.get_finished_spans()]
    sent_by_client = [span for span in client if span["name"].startswith("apply_async/")]
    assert len(sent_by_client) == 4  # the chain's first step, the chord's two header tasks, flaky
    assert all(span["trace_id"] == trace_id and span["kind"] == "PRODUCER" for span in sent_by_client)
    spans = wait_for_spans(spans_dir, {
        "run/apps.otel_app.add": 4, "run/apps.otel_app.tsum": 1, "run/apps.otel_app.flaky": 2,
        "apply_async/apps.otel_app.add": 1, "apply_async/apps.otel_app.tsum": 1,
        "apply_async/apps.otel_app.flaky": 1})
    everything = client + spans
    assert {span["trace_id"] for span in everything} == {trace_id}  # one trace for all of it
    ids = {span["span_id"]: span for span in everything}
    for span in spans:
        assert span["parent_id"] in ids, f"{span['name']} has a parent outside the trace"

    def parent(span: dict[str, Any]) -> dict[str, Any]:
        return ids[span["parent_id"]]

    # the chain: the client's publish, its run, the worker's publish of the next step, its run
    (second_publish,) = by_name(spans, "apply_async/apps.otel_app.add")
    assert parent(second_publish)["name"] == "run/apps.otel_app.add"
    assert parent(parent(second_publish))["name"] == "apply_async/apps.otel_app.add"
    assert parent(parent(parent(second_publish)))["name"] == "client-work"
    # the chord's body, sent by the worker that ran the last header task
    (body_run,) = by_name(spans, "run/apps.otel_app.tsum")
    assert parent(body_run)["name"] == "apply_async/apps.otel_app.tsum"
    assert parent(parent(body_run))["name"] == "run/apps.otel_app.add"
    # the retry: sent from the first run, whose span says why
    first, again = sorted(by_name(spans, "run/apps.otel_app.flaky"), key=lambda span: span["attributes"].get(
        "celery.retries", 0))
    assert first["attributes"]["celery.state"] == "RETRY"
    assert first["attributes"]["celery.retry.reason"] == "once more"
    assert parent(again)["name"] == "apply_async/apps.otel_app.flaky" and parent(parent(again)) is first
    assert again["attributes"]["celery.state"] == "SUCCESS" and again["attributes"]["celery.retries"] == 1


def test_a_failed_task_is_an_error_span_with_its_exception(workers, tmp_path, spans_dir, brokers):
    from apps import otel_app

    broker, results = brokers
    workers.start("--otel", app="apps.otel_app", pool="solo", broker=broker,
                  env=otel_env(tmp_path, spans_dir, broker, results))
    otel_app.app.conf.update(broker_url=broker, result_backend=results)
    try:
        with pytest.raises(ValueError, match="boom"):
            otel_app.boom.delay().get(timeout=20)
    finally:
        otel_app.app.close()
    (run,) = by_name(wait_for_spans(spans_dir, {"run/apps.otel_app.boom": 1}), "run/apps.otel_app.boom")
    assert run["status"] == "ERROR" and run["events"] == ["exception"]
    assert run["attributes"]["celery.state"] == "FAILURE"


def test_the_spans_of_recycled_prefork_children_are_exported_before_each_child_ends(
        workers, tmp_path, spans_dir, brokers):
    """The batch processor holds spans for 10 minutes here: only the flush as each child ends
    (after its one task, --max-tasks-per-child 1) exports them while the worker runs."""
    from apps import otel_app

    broker, results = brokers
    worker = workers.start("-c", "1", "--max-tasks-per-child", "1", "--otel", app="apps.otel_app",
                           pool="prefork", broker=broker,
                           env=otel_env(tmp_path, spans_dir, broker, results, delay_ms=600_000))
    otel_app.app.conf.update(broker_url=broker, result_backend=results)
    try:
        pids = [otel_app.pid.delay().get(timeout=30) for _ in range(3)]
    finally:
        otel_app.app.close()
    assert len(set(pids)) == 3  # each task in a child of its own, each replaced after it
    # the third child ends when the worker stops; the first two before that
    spans = wait_for_spans(spans_dir, {"run/apps.otel_app.pid": 2})
    assert {span["pid"] for span in by_name(spans, "run/apps.otel_app.pid")} >= set(pids[:2])
    assert worker.process.poll() is None
    assert worker.stop() == 0
    spans = wait_for_spans(spans_dir, {"run/apps.otel_app.pid": 3}, timeout=5)
    assert {span["pid"] for span in by_name(spans, "run/apps.otel_app.pid")} == set(pids)


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_celery_apps_task_is_traced_by_celerys_instrumentation_which_the_worker_turns_on(
        workers, tmp_path, spans_dir, brokers, celery_client, client_spans, pool):
    broker, results = brokers
    workers.start("-c", "1", "--otel", app="apps.celery_traced", pool=pool,
                  env=otel_env(tmp_path, spans_dir, broker, results))
    result = celery_client.send_task("apps.celery_traced.add", (4, 5))
    assert result.get(timeout=20) == 9
    spans = wait_for_spans(spans_dir, {"run/apps.celery_traced.add": 1, "add-inside": 1})
    publish = producer(client_spans[1], "apply_async/apps.celery_traced.add")
    (run,) = by_name(spans, "run/apps.celery_traced.add")
    (inside,) = by_name(spans, "add-inside")
    assert run["scope"] == "opentelemetry.instrumentation.celery"
    assert run["trace_id"] == inside["trace_id"] == format(publish.context.trace_id, "032x")
    assert run["parent_id"] == format(publish.context.span_id, "016x")
    assert inside["parent_id"] == run["span_id"]
    assert run["attributes"]["celery.state"] == "SUCCESS"


def test_an_app_task_has_the_attributes_celerys_instrumentation_gives_a_celery_task(
        workers, tmp_path, spans_dir, brokers, celery_client):
    """The same message sent to a task of this project's App and to a Celery app's (traced by
    the instrumentation itself), both under this worker: the same attribute names and values."""
    broker, results = brokers
    env = otel_env(tmp_path, spans_dir, broker, results)
    workers.start("--otel", "-Q", "app-queue", app="apps.otel_app", pool="solo", broker=broker, env=env)
    workers.start("--otel", "-Q", "celery-queue", app="apps.celery_traced", pool="solo", env=env)
    ours = celery_client.send_task("apps.otel_app.add", (1, 2), queue="app-queue")
    theirs = celery_client.send_task("apps.celery_traced.add", (1, 2), queue="celery-queue")
    assert ours.get(timeout=20) == theirs.get(timeout=20) == 3
    spans = wait_for_spans(spans_dir, {"run/apps.otel_app.add": 1, "run/apps.celery_traced.add": 1})
    (our_run,) = by_name(spans, "run/apps.otel_app.add")
    (their_run,) = by_name(spans, "run/apps.celery_traced.add")
    mine, reference = dict(our_run["attributes"]), dict(their_run["attributes"])
    differing = ("messaging.message.id", "messaging.conversation_id", "celery.task_name",
                 "messaging.destination", "celery.delivery_info", "celery.hostname")
    for key in differing:  # they differ as the messages and the workers do
        assert (key in mine) == (key in reference), key
        mine.pop(key, None)
        reference.pop(key, None)
    assert mine == reference
    assert our_run["attributes"]["messaging.destination"] == "app-queue"
    assert their_run["attributes"]["messaging.destination"] == "celery-queue"


def test_the_attributes_of_a_request_are_read_as_celerys_instrumentation_reads_them():
    """The mapping itself, against the instrumentation's own on the same values."""
    import kombu
    from opentelemetry.instrumentation.celery.utils import set_attributes_from_context
    from opentelemetry.sdk.trace import TracerProvider
    from worker_otel.attributes import request_attributes

    values = {"id": "t-1", "correlation_id": "t-1", "delivery_info": {"routing_key": "q", "exchange": ""},
              "hostname": "w@h", "origin": "client@h", "reply_to": "r-1", "retries": 2, "eta": "2026-01-01",
              "timelimit": (10, None), "priority": 3, "state": "SUCCESS", "expires": None, "exchange": "",
              "routing_key": "q", "declare": [kombu.Queue("q", kombu.Exchange("q", "direct"))]}
    span = TracerProvider().get_tracer("test").start_span("reference")
    set_attributes_from_context(span, values)
    reference = dict(span.attributes)
    ours = request_attributes(values.get)
    assert {key: list(value) if isinstance(value, tuple) else value
            for key, value in reference.items()} == ours


def test_without_the_option_opentelemetry_is_not_even_imported():
    script = ("import sys\nfrom worker_core.plugins.manager import PluginManager\n"
              "assert PluginManager().has_plugin('otel')\n"
              "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

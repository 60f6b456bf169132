"""OpenTelemetry's Celery instrumentation with a Celery app under ``workerctl worker``: one trace
from the client's publish to the task's run in the pool child, parented as under ``celery worker``
(the SDK's in-memory exporters on both sides)."""

from __future__ import annotations

import pytest
from conftest import REDIS_PORT, empty_redis, redis_db, require_server

pytestmark = pytest.mark.timeout(120)


def test_one_trace_runs_from_the_clients_publish_to_the_task_in_the_pool_child(workers):
    require_server(REDIS_PORT, "Redis")
    from celery import Celery
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    broker, results = empty_redis(redis_db(3)), empty_redis(redis_db(4))
    workers.start("-c", "1", app="apps.celery_otel", pool="prefork",
                  env={"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": results})
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    client = Celery("traced-client", broker=broker, backend=results)
    try:
        result = client.send_task("apps.celery_otel.add", (2, 3))
        assert result.get(timeout=20) == 5
        spans = client.send_task("apps.celery_otel.finished_spans").get(timeout=20)
    finally:
        instrumentor.uninstrument()
        client.close()
    published = [span for span in exporter.get_finished_spans()
                 if span.name == "apply_async/apps.celery_otel.add"]
    assert len(published) == 1
    producer = published[0]
    runs = [span for span in spans if span["name"] == "run/apps.celery_otel.add"]
    assert len(runs) == 1
    run = runs[0]
    assert run["kind"] == "CONSUMER"
    assert run["trace_id"] == format(producer.context.trace_id, "032x")  # one trace
    assert run["parent_id"] == format(producer.context.span_id, "016x")  # parented by the publish
    assert run["attributes"]["celery.state"] == "SUCCESS"
    assert run["attributes"]["messaging.message.id"] == result.id

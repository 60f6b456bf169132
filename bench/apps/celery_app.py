"""The benchmark tasks for the Celery worker (broker from BENCH_BROKER)."""

import os

import sink
from celery import Celery

app = Celery("bench", broker=os.environ["BENCH_BROKER"])
app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True)

if os.environ.get("BENCH_OTEL") == "1":  # compare.py --otel: OpenTelemetry's Celery instrumentation
    import tracing
    from celery.signals import worker_init, worker_process_init
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    def _trace() -> None:
        if tracing.set_up():
            CeleryInstrumentor().instrument()

    @worker_init.connect(weak=False)
    def _in_the_main_process(sender=None, **kwargs):
        if "prefork" not in str(getattr(sender, "pool_cls", "")):  # solo, threads: tasks run here
            _trace()

    @worker_process_init.connect(weak=False)
    def _in_each_child(**kwargs):  # prefork: as the instrumentation's documentation says
        _trace()


@app.task(name="bench.noop", ignore_result=True)
def noop():
    sink.noop()


@app.task(name="bench.latency", ignore_result=True)
def latency(sent_at):
    sink.latency(sent_at)


@app.task(name="bench.sleep", ignore_result=True)
def sleep(seconds):
    sink.sleep(seconds)

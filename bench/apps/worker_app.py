"""The benchmark tasks for this project's worker (broker from BENCH_BROKER)."""

import os
from pathlib import Path

import sink

from worker_core import App

app = App("bench", broker=os.environ["BENCH_BROKER"], task_ignore_result=True)

if os.environ.get("BENCH_OTEL") == "1":  # compare.py --otel: the worker runs with --otel
    import tracing

    @app.hook(tryfirst=True)  # before worker-otel's, which would set a provider up from OTEL_*
    def worker_process_init(pid):
        tracing.set_up()


if os.environ.get("BENCH_READY_DIR"):  # redis_cluster.py: each worker marks when it is ready
    @app.hook
    def worker_ready(worker):
        Path(os.environ["BENCH_READY_DIR"], str(os.getpid())).touch()


if os.environ.get("BENCH_ASYNC") == "1":  # -P asyncio: async def tasks, awaited on its loop
    @app.task(name="bench.noop", ignore_result=True)
    async def noop():
        sink.noop()

    @app.task(name="bench.latency", ignore_result=True)
    async def latency(sent_at):
        sink.latency(sent_at)
else:
    @app.task(name="bench.noop", ignore_result=True)
    def noop():
        sink.noop()

    @app.task(name="bench.latency", ignore_result=True)
    def latency(sent_at):
        sink.latency(sent_at)

    @app.task(name="bench.work", ignore_result=True)
    def work():
        sink.work()


@app.task(name="bench.sleep", ignore_result=True)
def sleep(seconds):
    sink.sleep(seconds)

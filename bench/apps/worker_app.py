"""The benchmark tasks for this project's worker (broker from BENCH_BROKER)."""

import os

import sink

from worker_core import App

app = App("bench", broker=os.environ["BENCH_BROKER"], task_ignore_result=True)


@app.task(name="bench.noop", ignore_result=True)
def noop():
    sink.noop()


@app.task(name="bench.latency", ignore_result=True)
def latency(sent_at):
    sink.latency(sent_at)


@app.task(name="bench.sleep", ignore_result=True)
def sleep(seconds):
    sink.sleep(seconds)

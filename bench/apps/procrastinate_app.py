"""The benchmark tasks for Procrastinate's worker (its own PostgreSQL tables, BENCH_POSTGRES)."""

import os

import procrastinate
import sink

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_POSTGRES"]))


@app.task(name="bench.noop", queue="bench")
def noop():
    sink.noop()


@app.task(name="bench.work", queue="bench")
def work():
    sink.work()


@app.task(name="bench.latency", queue="bench")
def latency(sent_at):
    sink.latency(sent_at)

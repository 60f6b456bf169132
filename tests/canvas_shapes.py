"""Canvases every client and worker must run alike: built with either client's kinds (``t``
holds ``chain``, ``group``, ``chord`` and the tasks), each with the value its result gets; and
the two clients that build them (this project's and Celery's), results in the suite's Redis."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import celery
from apps import basic, celery_basic
from conftest import REDIS_TEST_URL

from worker_core import canvas

#: The canvas tasks of ``apps.basic`` (and of ``apps.celery_basic``, under the same names).
TASKS = ("add", "mul", "tsum", "echo", "boom", "note_failure", "log_error", "flaky", "replaced", "grow_chord",
         "slow_add", "hop", "collect")


def _tasks(tasks):
    return {name: tasks[f"apps.basic.{name}"] for name in TASKS}


@contextlib.contextmanager
def our_client(broker: str, queue: str) -> Iterator[types.SimpleNamespace]:
    """``apps.basic``'s app sending to ``queue`` on ``broker``, results in the suite's Redis."""
    basic.app.conf.update(broker_url=broker, result_backend=REDIS_TEST_URL, task_default_queue=queue)
    try:
        yield types.SimpleNamespace(app=basic.app, chain=canvas.chain, group=canvas.group, chord=canvas.chord,
                                    **_tasks(basic.app.tasks))
    finally:
        basic.app.conf.update(broker_url=None, result_backend=None, task_default_queue="celery")
        basic.app.close()


@contextlib.contextmanager
def celery_client(broker: str, queue: str) -> Iterator[types.SimpleNamespace]:
    """A Celery 5.7 client of its own sending to ``queue`` on ``broker``, results in the suite's
    Redis."""
    app = celery_basic.client_app(broker_url=broker, result_backend=REDIS_TEST_URL, task_default_queue=queue)
    try:
        yield types.SimpleNamespace(app=app, chain=celery.chain, group=celery.group, chord=celery.chord,
                                    **_tasks(app.tasks))
    finally:
        app.close()

WORKFLOWS = {
    "chain": (lambda t: t.chain(t.add.s(2, 2), t.add.s(4), t.mul.s(3)).apply_async(), 24),
    "pipe with partial args": (lambda t: (t.add.s(2) | t.mul.s(3)).apply_async((1,)), 9),
    "immutable chain": (lambda t: (t.add.si(1, 1) | t.add.si(2, 2) | t.add.si(3, 3)).delay(), 6),
    "group": (lambda t: t.group(t.add.s(i, i) for i in range(5)).delay(), [0, 2, 4, 6, 8]),
    "chord": (lambda t: t.chord([t.add.s(i, i) for i in range(5)], t.tsum.s()).delay(), 20),
    "group | task": (lambda t: (t.group(t.add.s(1, 1), t.add.s(2, 2)) | t.tsum.s()).delay(), 6),
    "group of chains": (lambda t: t.group(t.add.s(1, 1) | t.mul.s(2), t.add.s(2, 2) | t.mul.s(3)).delay(),
                        [4, 12]),
    "chain inside a chord": (lambda t: t.chord([t.add.s(1, 1) | t.mul.s(2), t.add.s(2, 2)],
                                               t.tsum.s()).delay(), 8),
    "chord whose header holds a group": (lambda t: t.chord([t.add.s(1, 1), t.add.s(2, 2) | t.group(
        t.mul.s(2), t.mul.s(3))], t.echo.s()).delay(), [2, [8, 12]]),
    "chord with a chain body": (lambda t: t.chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s() | t.mul.s(10))
                                .delay(), 60),
    "chain through a chord": (lambda t: (t.add.s(1, 1) | t.group(t.mul.s(2), t.mul.s(3)) | t.tsum.s()
                                         | t.mul.s(10)).delay(), 100),
    "map": (lambda t: t.tsum.map([[1, 2], [3, 4]]).delay(), [3, 7]),
    "starmap": (lambda t: t.add.starmap([(1, 2), (3, 4)]).delay(), [3, 7]),
    "chunks": (lambda t: t.add.chunks([(i, i) for i in range(5)], 2).delay(), [[0, 2], [4, 6], [8]]),
    "replaced by a task": (lambda t: t.replaced.delay(3, "task"), 6),
    "replaced by a chain": (lambda t: t.replaced.delay(3, "chain"), 60),
    "replaced by a group": (lambda t: t.replaced.delay(3, "group"), [6, 9]),
    "replaced in a chain": (lambda t: (t.add.s(1, 1) | t.replaced.s(kind="chain") | t.mul.s(2)).delay(), 80),
    "replaced in a chord": (lambda t: t.chord([t.replaced.s(1, "task"), t.add.s(2, 2)], t.tsum.s()).delay(),
                            6),
    "added to a chord": (lambda t: t.chord([t.grow_chord.s(1), t.add.s(2, 2)], t.tsum.s()).delay(), 106),
}


def parents(result):
    """A result and those before it in its workflow, last first."""
    found = []
    while result is not None:
        found.append(result)
        result = result.parent
    return found

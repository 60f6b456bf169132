"""Hooks through pluggy, as a plugin author and an app author use them: pluggy's order
(wrappers, tryfirst, plain, trylast), observers isolated, each hook called when its
specification says, where it says (main process, loop thread, executor, client), with what."""

from __future__ import annotations

import json
import threading
import types
import uuid
from pathlib import Path
from typing import Any

import kombu
import pytest
from apps import basic
from workers import TESTS, wait_for

from worker_core import hookimpl
from worker_core.app.broker import connection_for, task_queue
from worker_core.plugins.manager import PluginManager

#: a plugin distribution of the test's own: it records every hook call it gets, one JSON line each
RECORDER = '''
import json, os, threading

from worker_core import hookimpl

PATH = os.environ["HOOKS_RECORD"]


def record(hook, **fields):
    fields = {key: value for key, value in fields.items() if isinstance(value, (str, int, float, bool))}
    line = json.dumps({"hook": hook, "pid": os.getpid(), "thread": threading.get_ident(), **fields})
    with open(PATH, "a") as handle:
        handle.write(line + "\\n")


@hookimpl
def worker_init(worker):
    record("worker_init", hostname=worker.hostname)


@hookimpl
def worker_ready(worker):
    record("worker_ready")


@hookimpl
def worker_shutdown(worker, how):
    record("worker_shutdown", how=how)


@hookimpl
def worker_process_init(pid):
    record("worker_process_init", given=pid)


@hookimpl
def worker_process_shutdown(pid, exitcode):
    record("worker_process_shutdown", given=pid, exitcode=exitcode)


@hookimpl
def task_received(request):
    record("task_received", id=request.id)


@hookimpl
def task_started(request, pid):
    record("task_started", id=request.id, child=pid)


@hookimpl
def task_succeeded(request, runtime, result):
    record("task_succeeded", id=request.id, result=result)


@hookimpl
def task_failed(request, exception, exc_type, exc_message, traceback):
    record("task_failed", id=request.id, exc_type=exc_type, exc_message=exc_message,
           exception=type(exception).__module__ + "." + type(exception).__qualname__,
           traceback=traceback.strip().splitlines()[-1])


@hookimpl
def task_retried(request, reason):
    record("task_retried", id=request.id)


@hookimpl
def task_rejected(request, reason, requeue):
    record("task_rejected", id=getattr(request, "id", None), reason=reason)


@hookimpl
def task_revoked(request, reason):
    record("task_revoked", id=request.id, reason=reason)


@hookimpl
def task_prerun(task_id, task, args, kwargs, request):
    record("task_prerun", id=task_id, name=task.name, current=request.id)


@hookimpl
def task_postrun(task_id, task, retval, state):
    record("task_postrun", id=task_id, state=state)


@hookimpl
def task_success(task, task_id, result):
    record("task_success", id=task_id, result=repr(result), stored=task.AsyncResult(task_id).state)


@hookimpl
def task_failure(task, task_id, exception, traceback):
    record("task_failure", id=task_id, exception=type(exception).__name__,
           has_traceback=traceback is not None, stored=task.AsyncResult(task_id).state)


@hookimpl
def task_retry(task_id, reason):
    record("task_retry", id=task_id, reason=type(reason).__name__)


@hookimpl
def before_task_publish(name, headers):
    record("before_task_publish", name=name, id=headers["id"])


@hookimpl
def after_task_publish(name, headers):
    record("after_task_publish", name=name, id=headers["id"])
'''

#: four implementations of one task hook, in every position pluggy orders
ORDERED = '''
import json, os

from worker_core import hookimpl

PATH = os.environ["HOOKS_RECORD"]


def record(who):
    with open(PATH, "a") as handle:
        handle.write(json.dumps({"hook": "order", "who": who, "pid": os.getpid()}) + "\\n")


@hookimpl(wrapper=True)
def task_prerun(task_id):
    record("wrapper before")
    result = yield
    record("wrapper after")
    return result


class TryFirst:
    @hookimpl(tryfirst=True)
    def task_prerun(self, task_id):
        record("tryfirst")


class Plain:
    @hookimpl
    def task_prerun(self, task_id):
        record("plain")


class TryLast:
    @hookimpl(trylast=True)
    def task_prerun(self, task_id):
        record("trylast")


class Raises:
    @hookimpl
    def task_prerun(self, task_id):
        raise RuntimeError("an observer that fails")


tryfirst, plain, trylast, raises = TryFirst(), Plain(), TryLast(), Raises()
'''


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _hooks(path: Path, hook: str) -> list[dict[str, Any]]:
    return [record for record in _records(path) if record["hook"] == hook]


@pytest.fixture
def recorded(site, tmp_path):
    """A worker environment with the recording plugin installed; the record file."""
    site.add("worker-hooks-recorder", {"worker.plugins": {"recorder": "hooks_recorder"}},
             {"hooks_recorder": RECORDER})
    record = tmp_path / "hooks.jsonl"
    env = {"PYTHONPATH": f"{site.root}:{TESTS}", "HOOKS_RECORD": str(record)}
    return env, record


def test_a_task_hook_runs_in_pluggys_order_in_the_prefork_child_and_a_failing_one_is_isolated(
        site, workers, embedded_broker, tmp_path):
    site.add("worker-hooks-ordered", {"worker.plugins": {
        "ordered-wrapper": "hooks_ordered", "ordered-tryfirst": "hooks_ordered:tryfirst",
        "ordered-plain": "hooks_ordered:plain", "ordered-trylast": "hooks_ordered:trylast",
        "ordered-raises": "hooks_ordered:raises"}}, {"hooks_ordered": ORDERED})
    record = tmp_path / "order.jsonl"
    worker = workers.start("-c", "1", pool="prefork", broker=embedded_broker,
                           env={"PYTHONPATH": f"{site.root}:{TESTS}", "HOOKS_RECORD": str(record)})
    child = basic.pid.delay().get(timeout=20)
    order = _hooks(record, "order")
    assert [entry["who"] for entry in order] == ["wrapper before", "tryfirst", "plain", "trylast",
                                                 "wrapper after"]
    assert {entry["pid"] for entry in order} == {child} and child != worker.pid
    worker.wait_log("plugin ordered-raises raised in task_prerun; carrying on")
    assert "RuntimeError: an observer that fails" in worker.log()


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_task_hooks_run_where_the_task_runs_and_worker_hooks_in_the_main_process(
        recorded, workers, embedded_broker, pool, tmp_path):
    env, record = recorded
    worker = workers.start("-c", "1", pool=pool, broker=embedded_broker, env=env)
    executor = basic.whoami.delay().get(timeout=20)
    with pytest.raises(basic.Boom):
        basic.boom.delay().get(timeout=20)
    assert basic.flaky.delay(1).get(timeout=20) == 1
    assert worker.stop() == 0
    main = worker.pid
    where = {"prefork": executor["pid"], "threads": main, "solo": main}[pool]
    assert (pool == "prefork") == (where != main)
    for hook in ("task_prerun", "task_postrun", "task_success", "task_failure", "task_retry"):
        calls = _hooks(record, hook)
        assert calls and {call["pid"] for call in calls} == {where}, (hook, calls)
    for hook in ("worker_init", "worker_ready", "worker_shutdown", "task_received", "task_started",
                 "task_succeeded", "task_failed", "task_retried"):
        calls = _hooks(record, hook)
        assert calls and {call["pid"] for call in calls} == {main}, (hook, calls)
    [prerun] = [call for call in _hooks(record, "task_prerun") if call["id"] == executor["id"]]
    assert prerun["name"] == "apps.basic.whoami" and prerun["current"] == executor["id"]
    assert [call["state"] for call in _hooks(record, "task_postrun")].count("SUCCESS") >= 2
    [failure] = _hooks(record, "task_failure")
    assert failure["exception"] == "Boom" and failure["has_traceback"] is True
    # the worker's main process gets the exception itself, sent over from the prefork child
    [failed] = _hooks(record, "task_failed")
    assert failed["exception"] == "apps.basic.Boom"
    assert (failed["exc_type"], failed["exc_message"]) == ("Boom", "boom")
    assert failed["traceback"] == "apps.basic.Boom: boom"
    # as Celery sends its signals: once the outcome is stored, so a hook reading it finds it
    assert failure["stored"] == "FAILURE"
    assert {call["stored"] for call in _hooks(record, "task_success")} == {"SUCCESS"}
    assert [call["reason"] for call in _hooks(record, "task_retry")] == ["RuntimeError"]
    [shutdown] = _hooks(record, "worker_shutdown")
    assert shutdown["how"] == "warm"
    if pool == "threads":  # in the thread that runs the tasks, not the loop's
        loop_thread = _hooks(record, "task_received")[0]["thread"]
        assert {call["thread"] for call in _hooks(record, "task_prerun")} != {loop_thread}


def test_each_prefork_child_gets_process_init_and_process_shutdown_in_itself(recorded, workers,
                                                                             embedded_broker):
    env, record = recorded
    worker = workers.start("-c", "1", "--max-tasks-per-child", "1", pool="prefork", broker=embedded_broker,
                           env=env)
    first = basic.pid.delay().get(timeout=20)
    second = basic.pid.delay().get(timeout=20)
    assert first != second  # the first child was recycled after one task
    wait_for(lambda: any(call["pid"] == first for call in _hooks(record, "worker_process_shutdown")), 10,
             message="the recycled child's worker_process_shutdown")
    inits = _hooks(record, "worker_process_init")
    assert {first, second} <= {call["pid"] for call in inits}
    assert all(call["given"] == call["pid"] for call in inits)
    [ended] = [call for call in _hooks(record, "worker_process_shutdown") if call["pid"] == first]
    assert ended["exitcode"] == 0 and ended["given"] == first
    assert worker.pid not in {call["pid"] for call in inits}


def test_rejected_and_revoked_tasks_reach_their_hooks(recorded, workers, embedded_broker):
    env, record = recorded
    workers.start(pool="solo", broker=embedded_broker, env=env)
    held = basic.add.apply_async((1, 2), countdown=60)  # waits in the worker for its ETA
    basic.app.send_task("apps.basic.nobody_has_this", (1,))
    wait_for(lambda: any(call["id"] == held.id for call in _hooks(record, "task_received")), 10,
             message="the held task's arrival")
    held.revoke()
    wait_for(lambda: _hooks(record, "task_revoked") and _hooks(record, "task_rejected"), 10,
             message="the revoked and rejected hooks")
    [revoked] = _hooks(record, "task_revoked")
    assert (revoked["id"], revoked["reason"]) == (held.id, "revoked")
    assert "unknown task 'apps.basic.nobody_has_this'" in _hooks(record, "task_rejected")[0]["reason"]


# -- hooks of app code ------------------------------------------------------------------------------


def test_app_code_implements_hooks_without_a_distribution_and_the_publish_hooks_run_in_the_client(
        workers, embedded_broker, tmp_path):
    calls: list[tuple[str, Any]] = []

    @basic.app.hook
    def before_task_publish(name, headers, properties):
        headers["x-trace"] = "trace-1"  # what a tracer does: the change is sent
        calls.append(("before", name, threading.get_ident()))

    holder = types.SimpleNamespace()

    @hookimpl
    def after_task_publish(name, headers):
        calls.append(("after", headers["id"], threading.get_ident()))

    holder.after_task_publish = after_task_publish
    basic.app.register_hooks(holder, name="test-after")
    try:
        queue = f"hooks-{uuid.uuid4().hex[:8]}"
        result = basic.app.send_task("apps.basic.add", (1, 2), queue=queue)
        assert calls == [("before", "apps.basic.add", threading.get_ident()),
                         ("after", result.id, threading.get_ident())]
        with connection_for(basic.app.plugins, embedded_broker, basic.app.settings) as connection:
            got = []
            consumer = kombu.Consumer(connection, [task_queue(queue, basic.app.settings)],
                                      callbacks=[lambda body, message: got.append(message)])
            with consumer:
                wait_for(lambda: connection.drain_events(timeout=1) or got, 10, message="the message")
            assert got[0].headers["x-trace"] == "trace-1"
            got[0].ack()
    finally:
        basic.app.unregister_hooks("test-after")
        basic.app.unregister_hooks(f"app:{__name__}.{before_task_publish.__qualname__}")


APP_HOOKS = '''
import os

from worker_core import App

app = App("apphooks")


@app.task
def pid():
    return os.getpid()


@app.hook
def task_prerun(task_id):
    with open(os.environ["HOOKS_RECORD"], "a") as handle:
        handle.write(f"{task_id} {os.getpid()}\\n")
'''


def test_hooks_registered_in_the_tasks_module_run_in_the_worker(workers, tmp_path):
    (tmp_path / "apphooks.py").write_text(APP_HOOKS)
    record = tmp_path / "prerun.txt"
    broker = f"embedded://{tmp_path}/queue.db"
    workers.start(app="apphooks", pool="prefork", broker=broker,
                  env={"PYTHONPATH": f"{tmp_path}:{TESTS}", "HOOKS_RECORD": str(record)})
    import importlib
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        apphooks = importlib.import_module("apphooks")
        apphooks.app.conf.update(broker_url=broker)
        result = apphooks.pid.delay()
        child = result.get(timeout=20)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("apphooks", None)
    assert record.read_text().split() == [result.id, str(child)]


# -- the plugin manager -------------------------------------------------------------------------------


def test_contributions_keep_the_plugin_that_made_them_in_pluggys_order():
    manager = PluginManager(autoload=False)

    class First:
        @hookimpl(tryfirst=True)
        def worker_control_commands(self):
            return {"first": lambda worker: None}

    class Second:
        @hookimpl
        def worker_control_commands(self):
            return {"second": lambda worker: None}

    class Nothing:
        @hookimpl
        def worker_control_commands(self):
            return None

    manager.register(Second(), "second")
    manager.register(Nothing(), "nothing")
    manager.register(First(), "first")
    collected = manager.collect("worker_control_commands")
    assert [(list(result), str(provider)) for result, provider in collected] == [
        (["first"], "first"), (["second"], "second")]


def test_a_plugin_registered_later_makes_its_hook_implemented_and_unregistering_undoes_it():
    manager = PluginManager(autoload=False)
    seen = manager.hooks.implemented  # the live set the worker's fast path holds
    assert "task_received" not in seen

    class Observer:
        @hookimpl
        def task_received(self, request):
            pass

    manager.register(Observer(), "observer")
    assert "task_received" in seen
    manager.unregister("observer")
    assert "task_received" not in seen and not manager.has_plugin("observer")


def test_an_observer_error_is_logged_with_plugin_and_hook_and_the_next_one_runs(caplog):
    manager = PluginManager(autoload=False)
    ran = []

    class Broken:
        @hookimpl(tryfirst=True)
        def worker_ready(self, worker):
            raise ValueError("broken observer")

    class Fine:
        @hookimpl
        def worker_ready(self, worker):
            ran.append(worker)

    manager.register(Broken(), "broken")
    manager.register(Fine(), "fine")
    manager.notify("worker_ready", worker="w")
    assert ran == ["w"]
    assert "plugin broken raised in worker_ready; carrying on" in caplog.text

"""Task classes as in Celery, in one process: a base class's attributes as option defaults,
``App(task_cls=...)``, class-based tasks with ``app.register_task``, the handlers a class
overrides, ``update_state``, and what the client puts on the message (headers, shadow names).
(Against real workers and a Celery client: ``test_task_api.py``.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apps import taskapi

from worker_core import App, Task
from worker_core.app.context import TaskContext
from worker_core.app.task_options import CELERY_ONLY
from worker_core.exceptions import ConfigurationError
from worker_core.protocol import custom_headers, task_message


class Careful(Task):
    max_retries = 7
    acks_late = True
    queue = "slow"
    rate_limit = "5/s"
    autoretry_for = (KeyError,)
    default_retry_delay = 2
    time_limit = 10
    ignore_result = None  # None: the app's setting, as for Task itself
    label = "careful"

    def describe(self) -> str:
        return f"{self.label} {self.name}"


def double(x: int) -> int:
    return 2 * x


@pytest.fixture
def app(tmp_path: Path) -> App:
    app = App("unit", broker=f"embedded://{tmp_path}/queue.db", backend=f"embedded://{tmp_path}/results.db")
    yield app
    app.close()


def test_a_base_classs_attributes_are_its_tasks_defaults_and_the_decorators_options_win(app: App) -> None:
    task = app.task(base=Careful)(double)
    assert isinstance(task, Careful) and task(4) == 8
    assert (task.max_retries, task.acks_late, task.queue, task.rate_limit, task.rate_per_second) == (
        7, True, "slow", "5/s", 5.0)
    assert (task.autoretry_for, task.default_retry_delay, task.time_limit) == ((KeyError,), 2.0, 10)
    assert task.describe() == f"careful {__name__}.double"
    assert task.ignore_result is False
    app.conf.update(task_ignore_result=True)
    assert task.ignore_result is True  # a None default still follows the setting
    other = app.task(base=Careful, name="unit.other", acks_late=False, max_retries=1, label="other")(double)
    assert (other.acks_late, other.max_retries, other.label, other.queue) == (False, 1, "other", "slow")
    assert task.label == "careful"  # the other task's option changed only that task


def test_options_set_by_a_classs_init_or_later_are_the_tasks(app: App) -> None:
    class Configured(Task):
        def __init__(self) -> None:
            self.max_retries = 9
            self.acks_late = True

    task = app.task(base=Configured)(double)
    assert (task.max_retries, task.acks_late) == (9, True)
    task.acks_late = None  # None follows the setting again
    assert task.acks_late is False
    app.conf.update(task_acks_late=True)
    assert task.acks_late is True and Task.acks_late.setting == "task_acks_late"


def test_app_task_cls_is_the_class_of_every_task_given_as_a_class_or_its_name(tmp_path: Path) -> None:
    by_class = App("unit", task_cls=Careful)
    assert isinstance(by_class.task(double), Careful) and by_class.Task is Careful
    by_name = App("unit", task_cls="apps.taskapi:Sturdy")
    task = by_name.task(double)
    assert isinstance(task, taskapi.Sturdy) and by_name.Task is taskapi.Sturdy
    assert task.autoretry_for == (ConnectionError,)
    assert isinstance(App("unit").task(double), Task)
    with pytest.raises(ConfigurationError, match=r"task_cls must be a subclass of worker_core\.Task"):
        App("unit", task_cls=dict)
    missing = App("unit", task_cls="apps.taskapi:Nothing")
    with pytest.raises(ConfigurationError, match=r"task_cls 'apps.taskapi:Nothing' cannot be imported"):
        missing.task(double)


def test_register_task_names_a_class_based_task_as_celery_does(app: App) -> None:
    class Triple(Task):
        def run(self, x: int) -> int:
            return 3 * x

    class Named(Task):
        name = "unit.named"

        def run(self) -> str:
            return self.request.task or ""

    triple = app.register_task(Triple)
    assert triple.name == f"{__name__}.Triple" and app.tasks[triple.name] is triple and triple(2) == 6
    named = Named()
    assert app.register_task(named) is named and app.register_task(named) is named
    assert named.name == "unit.named" and named() == "unit.named"
    assert app.register_task(Triple(), name="unit.triple", max_retries=1).max_retries == 1

    class Bodiless(Task):
        pass

    with pytest.raises(ConfigurationError, match=r"has no body: a class-based task defines run\(self, ...\)"):
        app.register_task(Bodiless)
    with pytest.raises(ConfigurationError, match=r"register_task needs a subclass of worker_core\.Task"):
        app.register_task(double)


def test_a_bad_class_attribute_is_refused_naming_the_task_the_class_and_the_value(app: App) -> None:
    class Bad(Task):
        max_retries = "x"

    with pytest.raises(ConfigurationError) as refused:
        app.task(base=Bad)(double)
    assert str(refused.value).startswith(f"@app.task for '{__name__}.double': ")
    assert "Bad.max_retries must be a whole number, 0 or more, or None (got 'x')" in str(refused.value)

    class Late(Task):
        acks_late = "yes"

    with pytest.raises(ConfigurationError, match=r"Late\.acks_late must be True, False or None"):
        app.task(base=Late)(double)
    with pytest.raises(ConfigurationError, match="unknown option 'labell'"):
        app.task(base=Careful, labell="x")(double)
    assert "base" not in CELERY_ONLY


def test_a_task_calls_only_the_handlers_its_class_or_options_give_it(app: App) -> None:
    class Watched(Task):
        def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None: ...

    seen: list[Any] = []

    def on_failure(task: Task, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        seen.append((task, exc))

    assert app.task(double).handlers == frozenset()
    assert app.task(base=Watched)(double).handlers == frozenset({"on_success"})
    given = app.task(name="unit.given", on_failure=on_failure)(double)
    assert given.handlers == frozenset({"on_failure"})
    error = ValueError("x")
    given.on_failure(error, "id", [], {}, None)
    assert seen == [(given, error)]
    with pytest.raises(ConfigurationError, match="on_retry must be a function taking the task first"):
        app.task(name="unit.bad", on_retry=3)(double)


def test_a_direct_call_runs_the_body_with_a_request_of_its_own(app: App) -> None:
    @app.task(bind=True)
    def whoami(self: Task, x: int) -> tuple[Any, ...]:
        return (self.request.called_directly, self.request.args, self.request.id)

    assert whoami(5) == (True, [5], None)
    wrapped = app.task(base=taskapi.Wrapping, bind=True, name="unit.wrapped")(
        lambda self, x: (self.request.called_directly, x))
    assert wrapped(1) == {"wrapped": (True, 1), "request_id": None}
    assert wrapped.overrides_call and not whoami.overrides_call


def test_update_state_stores_a_state_of_the_tasks_own_with_its_meta(app: App) -> None:
    task = app.task(double)
    task.update_state(task_id="unit-progress", state="PROGRESS", meta={"done": 1, "total": 4})
    result = app.AsyncResult("unit-progress")
    assert (result.state, result.info, result.ready()) == ("PROGRESS", {"done": 1, "total": 4}, False)
    task.update_state(task_id="unit-failed", state="FAILURE", meta=KeyError("gone"))
    failed = app.AsyncResult("unit-failed")
    assert failed.state == "FAILURE" and isinstance(failed.result, KeyError)
    assert failed.result.args == ("gone",)
    with pytest.raises(RuntimeError, match="needs task_id= outside a worker"):
        task.update_state(state="PROGRESS")
    with pytest.raises(ValueError, match="update_state needs a state"):
        task.update_state(task_id="x", state="")


def test_the_client_puts_headers_and_shadow_names_on_the_message_as_celerys_does(app: App) -> None:
    published: list[dict[str, Any]] = []

    @app.hook
    def before_task_publish(headers: dict[str, Any]) -> None:
        published.append(dict(headers))

    class Shadowed(Task):
        def shadow_name(self, args: Any, kwargs: Any, options: Any) -> str:
            return f"shadow.{args[0]}"

    task = app.task(base=Shadowed, name="unit.shadowed")(double)
    task.apply_async((3,), headers={"tenant": "acme", "task_priority_class": 2})
    task.apply_async((4,), shadow="given")
    app.send_task("unit.other", headers={"tenant": "named"}, shadow="named.shadow")
    first, second, third = published
    assert (first["shadow"], first["tenant"], first["task_priority_class"], first["task"]) == (
        "shadow.3", "acme", 2, "unit.shadowed")
    assert second["shadow"] == "given" and "tenant" not in second
    assert (third["shadow"], third["tenant"]) == ("named.shadow", "named")
    with pytest.raises(TypeError, match=r"send_task\('unit.other'\): headers must be a mapping"):
        app.send_task("unit.other", headers=[("a", 1)])


def test_a_calls_own_serializer_wins_over_the_tasks(app: App) -> None:
    from worker_core.app.broker import connection_for, task_queue

    task = app.task(name="unit.serialized", serializer="json")(double)
    task.apply_async((3,), serializer="yaml", queue="serialized")
    task.apply_async((4,), queue="serialized")
    with connection_for(app.plugins, app.broker_urls[0], app.settings) as connection:
        queue = task_queue("serialized", app.settings)(connection.default_channel)
        sent = [queue.get(no_ack=True, accept={"json", "yaml"}) for _ in range(2)]
    assert [message.content_type for message in sent] == ["application/x-yaml", "application/json"]
    assert [message.decode()[0] for message in sent] == [[3], [4]]


def test_a_messages_own_headers_are_told_from_the_protocols_and_read_as_request_attributes() -> None:
    message = task_message("unit.add", "id-1", (1, 2), {})
    assert custom_headers(message.headers) is None
    assert custom_headers({**message.headers, "tenant": "acme", "x-worker-lost": 1}) == {"tenant": "acme"}
    request = TaskContext(id="id-1", headers={"tenant": "acme"})
    assert (request.tenant, request.get("tenant"), request.get("nothing", 3)) == ("acme", "acme", 3)
    with pytest.raises(AttributeError, match="'TaskContext' object has no attribute 'nothing'"):
        request.nothing  # noqa: B018

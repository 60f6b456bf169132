"""``inspect conf``: the settings a worker runs with, as Celery's ``conf`` lists them, with
secrets hidden."""

from __future__ import annotations

from apps import basic
from workers import TESTS, ask

from worker_core.redaction import redact_value


def test_passwords_and_secret_looking_values_are_hidden():
    shown = redact_value("broker_url", "redis://:pw@h:6379/0;amqp://u:p@r//")
    assert shown == "redis://:**@h:6379/0;amqp://u:**@r//"
    options = {"sentinel_kwargs": {"password": "x"}, "visibility_timeout": 5, "api_token": "t"}
    assert redact_value("broker_transport_options", options) == {
        "sentinel_kwargs": {"password": "********"}, "visibility_timeout": 5, "api_token": "********"}
    assert redact_value("accept_content", ("json", "pickle")) == ["json", "pickle"]
    assert redact_value("result_expires", None) is None


def test_conf_lists_what_differs_from_the_defaults_or_everything(workers, embedded_broker):
    workers.start(broker=embedded_broker, env={"PYTHONPATH": str(TESTS), "WORKER_TASK_ACKS_LATE": "true"})
    changed = ask(basic.app, "conf")
    assert changed["broker_url"] == embedded_broker and changed["task_acks_late"] is True
    assert "worker_prefetch_multiplier" not in changed
    everything = ask(basic.app, "conf", with_defaults=True)
    assert everything["worker_prefetch_multiplier"] == 4 and everything["task_acks_late"] is True

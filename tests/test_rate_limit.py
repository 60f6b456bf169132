"""Task rate limits, as Celery's: a token bucket per task name in each worker."""

from __future__ import annotations

import time

import pytest
from apps import basic
from workers import TESTS, ask

from worker_core import App
from worker_core.exceptions import ConfigurationError, TaskRevokedError
from worker_core.rates import parse_rate


@pytest.mark.parametrize(("given", "per_second"), [
    ("10/s", 10), ("10", 10), ("120/m", 2), ("7200/h", 2), ("0.5/s", 0.5), (3, 3), (0.25, 0.25),
    (None, 0), ("", 0), ("0", 0), (0, 0),
])
def test_rates_read_as_celery_reads_them(given, per_second):
    assert parse_rate(given) == pytest.approx(per_second)


@pytest.mark.parametrize("given", ["fast", "10/d", "-1/s", "1/s/s", "nan", True, [10], -2])
def test_a_bad_rate_is_refused_with_what_to_write(given):
    with pytest.raises(ValueError, match=r"a rate limit is a number of tasks per second or a string like"):
        parse_rate(given)
    app = App("rates")
    with pytest.raises(ConfigurationError, match=r"@app\.task for 'test_rate_limit\.<lambda>': rate_limit: "):
        app.task(rate_limit=given)(lambda: None)


@pytest.fixture
def start(workers, embedded_broker):
    def start(pool: str, *args: str, **env: str):
        return workers.start("-c", "2", *args, pool=pool, broker=embedded_broker,
                             env={"PYTHONPATH": str(TESTS), **env})

    return start


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_limited_task_starts_at_most_at_its_rate(start, pool):
    start(pool)
    results = [basic.limited.delay() for _ in range(6)]
    starts = sorted(result.get(timeout=30) for result in results)
    # four a second with a bucket of one: the first at once, then one every 0.25 s
    assert starts[-1] - starts[0] >= 5 * 0.25 * 0.9
    assert basic.add.delay(1, 1).get(timeout=20) == 2


def test_rate_limits_can_be_switched_off_for_the_worker(start):
    start("threads", WORKER_WORKER_DISABLE_RATE_LIMITS="true")
    results = [basic.limited.delay() for _ in range(6)]
    starts = sorted(result.get(timeout=30) for result in results)
    assert starts[-1] - starts[0] < 0.5
    assert ask(basic.app, "rate_limit", task_name="apps.basic.limited", rate_limit="1/s") == {
        "error": "rate limits are disabled on this worker (worker_disable_rate_limits)"}


def test_the_rate_limit_command_changes_and_lifts_a_limit_and_waiting_tasks_follow(start):
    start("threads")
    assert ask(basic.app, "rate_limit", task_name="apps.basic.limited", rate_limit="1/m") == {
        "ok": "new rate limit set successfully"}
    results = [basic.limited.delay() for _ in range(4)]
    assert results[0].get(timeout=20)  # the bucket's one token; the others wait a minute each
    time.sleep(0.3)  # a negative: a while in which a task with no token would run, were it let
    assert not any(result.ready() for result in results[1:])
    revoked = results[3]
    assert ask(basic.app, "revoke", task_id=revoked.id) == {
        "ok": f"tasks { {revoked.id} } flagged as revoked"}
    with pytest.raises(TaskRevokedError):  # discarded while it waited for a token
        revoked.get(timeout=10)
    lifted = time.monotonic()
    assert ask(basic.app, "rate_limit", task_name="apps.basic.limited", rate_limit="0") == {
        "ok": "rate limit disabled successfully"}
    assert all(result.get(timeout=10) for result in results[1:3])
    assert time.monotonic() - lifted < 5


@pytest.mark.parametrize(("arguments", "error"), [
    ({"task_name": "apps.basic.limitd", "rate_limit": "1/s"},
     "unknown task 'apps.basic.limitd'. Did you mean 'apps.basic.limited'?"),
    ({"task_name": "apps.basic.limited", "rate_limit": "often"},
     "Invalid rate limit string: a rate limit is a number of tasks per second or a string like"),
])
def test_bad_rate_limit_commands_get_an_error(start, arguments, error):
    start("solo")
    answer = ask(basic.app, "rate_limit", **arguments)
    assert isinstance(answer, dict) and answer["error"].startswith(error)

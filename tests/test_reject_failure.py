"""A task that rejects its message for good (``Reject(requeue=False)``) has FAILURE stored, the
``Reject`` itself, as Celery 5.7 stores it: the message never runs again, so a client waiting on
it must not wait on PENDING forever."""

from __future__ import annotations

import pytest
from apps import basic
from conftest import REDIS_PORT, empty_redis, redis_db, require_server
from workers import TESTS

from worker_core.exceptions import Reject

pytestmark = pytest.mark.timeout(60)


def test_a_task_that_rejects_its_message_for_good_is_stored_as_failure(workers):
    require_server(REDIS_PORT, "Redis")
    broker, results = empty_redis(redis_db(11)), empty_redis(redis_db(12))
    worker = workers.start(broker=broker, backend=results, env={"PYTHONPATH": str(TESTS)})
    basic.app.conf.update(broker_url=broker, result_backend=results)
    try:
        result = basic.reject_for_good.delay("not for this worker")
        with pytest.raises(Reject) as raised:
            result.get(timeout=20)
        assert raised.value.args == ("not for this worker", False) and result.state == "FAILURE"
        worker.wait_log(f"Task apps.basic.reject_for_good[{result.id}] rejected itself (requeue=False): "
                        f"not for this worker")
    finally:
        basic.app.close()

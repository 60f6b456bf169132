"""pickle is never accepted quietly: a worker that accepts it says what that allows, and the
refusal of a pickled message does not suggest accepting it."""

from __future__ import annotations

import pickle

import pytest
from workers import TESTS

from worker_core.exceptions import ContentDisallowed
from worker_core.protocol import JSON, decode_task

PICKLE = "application/x-python-serialize"


def test_a_pickled_message_is_refused_without_advice_to_accept_pickle():
    headers = {"task": "apps.basic.add", "id": "1"}
    with pytest.raises(ContentDisallowed) as refused:
        decode_task(headers, {}, pickle.dumps([[1, 2], {}, {}]), PICKLE, "binary",
                    accept=frozenset({JSON}), max_size=1 << 20)
    assert str(refused.value) == f"content type '{PICKLE}' is not accepted (accepted: {JSON})"
    with pytest.raises(ContentDisallowed, match="add its serializer to the accept_content setting"):
        decode_task(headers, {}, b"x: 1", "application/x-yaml", "utf-8", accept=frozenset({JSON}),
                    max_size=1 << 20)


@pytest.mark.parametrize("accepted", ["json,pickle", f"json,{PICKLE}"])
def test_a_worker_that_accepts_pickle_warns_at_start_what_that_allows(workers, embedded_broker, accepted):
    worker = workers.start(broker=embedded_broker,
                           env={"PYTHONPATH": str(TESTS), "WORKER_ACCEPT_CONTENT": accepted})
    worker.wait_log("accept_content includes pickle: a pickled message runs whatever code its sender put "
                    "in it")
    assert "Anyone who can publish to the broker can then run code here" in worker.log()


def test_a_worker_on_the_defaults_does_not_warn_about_pickle(workers, embedded_broker):
    worker = workers.start(broker=embedded_broker, env={"PYTHONPATH": str(TESTS)})
    assert "pickle" not in worker.log()

"""Every result backend honours the result backend contract against a real store (the embedded
file, Redis database 7; ``rpc://`` through RabbitMQ, Redis database 7 and the embedded file;
``disabled`` for what it promises), and the contract catches a backend that breaks a promise,
naming it and the check."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import AMQP_TEST_URL, empty_redis, redis_db, require_server

from worker_core.app.settings import Settings
from worker_core.results.disabled import DisabledBackend
from worker_core.results.embedded import EmbeddedBackend
from worker_core.results.meta import PENDING, SUCCESS, pending_meta
from worker_core.results.rpc.backend import RPCBackend
from worker_core.slots import ResultBackend
from worker_core.testing import result_backend_contract
from worker_transport_redis.backend import RedisBackend

REDIS_CONTRACT_URL = redis_db(7)

BACKENDS = ["embedded", "redis", "disabled", "rpc-amqp", "rpc-redis", "rpc-embedded"]
CLASSES: dict[str, type[ResultBackend]] = {
    "embedded": EmbeddedBackend, "redis": RedisBackend, "disabled": DisabledBackend,
    "rpc-amqp": RPCBackend, "rpc-redis": RPCBackend, "rpc-embedded": RPCBackend,
}
#: Each backend with every check that says something about it (``disabled`` has no round trips).
CASES = [(name, check) for name in BACKENDS for check in result_backend_contract.CHECKS
         if result_backend_contract.applies(check, CLASSES[name])]


@pytest.fixture(scope="module")
def redis_db() -> Iterator[str]:
    """Redis database 7, emptied before and after the module."""
    yield empty_redis(REDIS_CONTRACT_URL)
    empty_redis(REDIS_CONTRACT_URL)


def _url(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if name == "embedded":
        return f"embedded://{tmp_path}/results.db"
    if name == "redis":
        return str(request.getfixturevalue("redis_db"))
    if name.startswith("rpc"):
        return "rpc://"
    return "disabled"


def _settings(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Settings | None:
    """The broker an ``rpc://`` backend sends results through."""
    if name == "rpc-amqp":
        require_server(5672, "RabbitMQ")
        return Settings(broker_url=AMQP_TEST_URL)
    if name == "rpc-redis":
        return Settings(broker_url=str(request.getfixturevalue("redis_db")))
    if name == "rpc-embedded":
        return Settings(broker_url=f"embedded://{tmp_path}/queue.db")
    return None


@pytest.mark.parametrize(("backend", "check"), CASES,
                         ids=[f"{name}-{result_backend_contract.check_name(check)}" for name, check in CASES])
def test_result_backend_honours_the_result_backend_contract(
    backend: str, check: result_backend_contract.Check, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    check(CLASSES[backend], _url(backend, request, tmp_path), settings=_settings(backend, request, tmp_path))


def test_the_disabled_backend_is_checked_only_for_what_it_promises() -> None:
    checked = [result_backend_contract.check_name(check) for name, check in CASES if name == "disabled"]
    assert checked == ["the_class_satisfies_the_result_backend_protocol",
                       "a_backend_that_discards_results_keeps_its_promise"]


def test_run_all_passes_for_the_embedded_backend(tmp_path: Path) -> None:
    result_backend_contract.run_all(EmbeddedBackend, f"embedded://{tmp_path}/results.db")


# -- the contract catches what a backend gets wrong ---------------------------------------------------


def _fails(backend: type[ResultBackend], url: str, check: str, *expected: str) -> None:
    with pytest.raises(AssertionError) as caught:
        result_backend_contract.run_all(backend, url, only=[check])
    message = str(caught.value)
    assert message.startswith(f"{backend.__module__}.{backend.__qualname__} fails check_{check}: "), message
    for text in expected:
        assert text in message, message


def test_a_wait_for_that_gives_up_without_result_timeout_is_caught(tmp_path: Path) -> None:
    class Impatient(EmbeddedBackend):
        def wait_for(self, task_id: str, timeout: float | None = None,
                     interval: float = 0.5) -> Mapping[str, Any]:
            time.sleep(timeout or 0)  # the backend under test waits out its timeout, then fails wrongly
            raise TimeoutError(task_id)

    _fails(Impatient, f"embedded://{tmp_path}/r.db", "wait_for_raises_result_timeout_after_its_timeout",
           "wait_for() raised TimeoutError(", "it must raise worker_core.exceptions.ResultTimeout")


def test_a_wait_for_that_returns_before_the_result_is_caught(tmp_path: Path) -> None:
    class Hasty(EmbeddedBackend):
        def wait_for(self, task_id: str, timeout: float | None = None,
                     interval: float = 0.5) -> Mapping[str, Any]:
            return self.get_task_meta(task_id)

    _fails(Hasty, f"embedded://{tmp_path}/r.db", "wait_for_returns_when_another_thread_stores",
           "wait_for() returned {'status': 'PENDING'")


def test_a_broken_promise_that_a_success_is_final_is_caught(redis_db: str) -> None:
    class Forgetful(RedisBackend):
        def store_result(self, task_id: str, result: Any, state: str, traceback: str | None = None,
                         request: Mapping[str, Any] | None = None) -> None:
            self.forget(task_id)  # so the store script finds no SUCCESS to keep
            super().store_result(task_id, result, state, traceback, request)

    _fails(Forgetful, redis_db, "a_success_is_never_overwritten_when_promised",
           "promises success_is_final, yet a FAILURE stored after the SUCCESS left")


def test_a_backend_that_does_not_keep_deleted_groups_away_is_caught(tmp_path: Path) -> None:
    class Sticky(EmbeddedBackend):
        def delete_group(self, group_id: str) -> None:
            """Deletes nothing."""

    _fails(Sticky, f"embedded://{tmp_path}/r.db", "saved_groups_restore_as_saved_when_offered",
           "after delete_group() the group restores as [[")


def test_a_backend_that_restores_groups_in_another_shape_is_caught(tmp_path: Path) -> None:
    class Flattening(EmbeddedBackend):
        def restore_group(self, group_id: str) -> Any | None:
            saved = super().restore_group(group_id)
            return None if saved is None else [saved[0], [child for child in saved[1] if child[1] is None]]

    _fails(Flattening, f"embedded://{tmp_path}/r.db", "saved_groups_restore_as_saved_when_offered",
           "restore_group() gave")


def test_the_checks_of_a_capability_apply_only_to_backends_offering_it() -> None:
    names = {name: [result_backend_contract.check_name(check) for backend, check in CASES if backend == name]
             for name in ("embedded", "redis")}
    chords = {"a_chord_join_can_be_prepared_when_offered",
              "a_chord_counts_each_part_once_and_one_count_claims_its_body_when_offered",
              "a_chord_claim_is_taken_once_lapses_and_survives_failures_when_offered"}
    for name in ("embedded", "redis"):
        assert {"saved_groups_restore_as_saved_when_offered", *chords} <= set(names[name])
    assert not chords & {result_backend_contract.check_name(check) for backend, check in CASES
                         if backend == "disabled"}
    rpc = [result_backend_contract.check_name(check) for backend, check in CASES if backend == "rpc-amqp"]
    assert "only_the_client_that_sent_a_task_reads_it_when_offered" in rpc
    assert "only_the_client_that_sent_a_task_reads_it_when_offered" not in names["redis"]
    assert not {"saved_groups_restore_as_saved_when_offered", *chords} & set(rpc)


def test_a_backend_ignoring_result_extended_is_caught(tmp_path: Path) -> None:
    class Terse(EmbeddedBackend):
        def __init__(self, url: str, settings: Settings) -> None:
            super().__init__(url, settings)
            self.extended = False

    _fails(Terse, f"embedded://{tmp_path}/r.db", "result_extended_stores_the_request_fields",
           "with result_extended stored {'name': None")


def test_an_unknown_task_that_is_not_pending_is_caught(tmp_path: Path) -> None:
    class Presumptuous(EmbeddedBackend):
        def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
            meta = super().get_task_meta(task_id)
            return {**meta, "status": SUCCESS} if meta["status"] == PENDING else meta

    _fails(Presumptuous, f"embedded://{tmp_path}/r.db", "an_unknown_task_is_pending",
           "of an unknown task returned {'status': 'SUCCESS'")


def test_a_discarding_backend_that_reads_pending_is_caught() -> None:
    class Quiet(DisabledBackend):
        def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
            return pending_meta(task_id)

    _fails(Quiet, "disabled", "a_backend_that_discards_results_keeps_its_promise",
           "discards results, yet get_task_meta() did not raise BackendDisabled")


def test_a_backend_claiming_a_capability_with_the_wrong_type_is_caught(tmp_path: Path) -> None:
    class Vague(EmbeddedBackend):
        success_is_final: ClassVar[bool] = "yes"  # type: ignore[assignment]

    _fails(Vague, f"embedded://{tmp_path}/r.db", "the_class_satisfies_the_result_backend_protocol",
           "success_is_final must be a bool (got 'yes')")


def test_an_rpc_backend_whose_threads_share_one_reply_queue_is_caught(redis_db: str) -> None:
    class Shared(RPCBackend):
        """Every thread reads the first thread's queue: each would take the others' results."""

        def _client(self) -> Any:
            if not hasattr(self, "_shared"):
                self._shared = super()._client()
            return self._shared

    with pytest.raises(AssertionError) as caught:
        result_backend_contract.run_all(Shared, "rpc://", settings=Settings(broker_url=redis_db),
                                        only=["only_the_client_that_sent_a_task_reads_it_when_offered"])
    assert "reply_to() gave the same name" in str(caught.value), caught.value

"""What a message carries (its task name, its id) reaches a log line bounded and on one line,
whatever its size or content."""

from __future__ import annotations

from apps import basic
from workers import TESTS, wait_for

from worker_core.protocol import shown


def test_shown_text_is_bounded_and_kept_on_one_line():
    assert shown("apps.basic.add") == "apps.basic.add"
    assert shown("x" * 10_000) == "x" * 197 + "..."
    assert "\n" not in shown("evil\n[2026-01-01: ERROR/MainProcess] forged")
    assert len(shown("a\nb" * 5_000)) <= 200


def test_a_huge_task_id_and_an_unknown_huge_task_name_give_short_log_lines(workers, embedded_broker):
    worker = workers.start(broker=embedded_broker, env={"PYTHONPATH": str(TESTS)})
    huge_id = "id-" + "x" * 100_000
    basic.app.send_task("apps.basic.add", (1, 2), task_id=huge_id)
    basic.app.send_task("apps." + "n" * 100_000 + "\nforged line", (1, 2))
    assert basic.add.delay(2, 3).get(timeout=20) == 5  # both came before it
    wait_for(lambda: "Rejected message" in worker.log() and "succeeded" in worker.log(), 10,
             message="the refusal and the task's end")
    lines = worker.log().splitlines()
    assert all(len(line) < 2_000 for line in lines), max(len(line) for line in lines)
    assert any("apps.basic.add[id-xxx" in line and "received" in line for line in lines)
    assert not any(line.startswith("forged line") for line in lines)

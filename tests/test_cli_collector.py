"""The collector pause around a command's start (``worker_core.cli.collector``)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from worker_core.cli import collector, main, run


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()
    gc.unfreeze()


def test_the_collector_is_off_inside_the_pause_and_on_after_it():
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0  # a command that ends just turns it back on


def test_resume_turns_it_on_with_what_was_made_so_far_frozen():
    with collector.paused():
        made = [[] for _ in range(100)]
        collector.resume()
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(made)
    assert gc.isenabled()


def test_a_collector_turned_off_on_purpose_stays_off():
    gc.disable()
    with collector.paused():
        collector.resume()
        assert not gc.isenabled()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_workerctl_runs_its_command_with_the_collector_off_and_leaves_it_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    original = main.get_command

    def spy(ctx, name):
        seen.append(gc.isenabled())
        return original(ctx, name)

    monkeypatch.setattr(sys, "argv", ["workerctl", "plugins"])
    main.get_command = spy  # type: ignore[method-assign]
    try:
        with pytest.raises(SystemExit) as exited:
            run()
    finally:
        del main.get_command
    assert exited.value.code == 0
    assert seen and not any(seen)
    assert gc.isenabled()

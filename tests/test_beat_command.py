"""``workerctl beat``: the entries kept on the broker are added, listed, disabled, enabled and removed
from the command line, bad ones refused in one line; ``-B``, ``-s`` and ``--scheduler`` are the
plugin's options with Celery's spellings, and the core's error for them without the plugin names
what to do."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from worker_beat.plugin import worker_options

from worker_core.cli.celery_options import FROM_PLUGINS
from worker_core.cli.group import main


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An app ``beat_cli_app`` on an embedded file of the test's own, with one settings entry."""
    (tmp_path / "beat_cli_app.py").write_text(
        "from worker_core import App\n"
        "from worker_beat import crontab\n"
        f"app = App('beat_cli', broker='embedded://{tmp_path}/queue.db', result_backend='disabled')\n"
        "app.conf.beat_schedule = {'nightly': {'task': 'proj.nightly',\n"
        "                                      'schedule': crontab(minute=0, hour=3)}}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)
    yield "beat_cli_app"
    sys.modules.pop("beat_cli_app", None)


def beat(*args: str) -> Result:
    return CliRunner().invoke(main, ["beat", *args], catch_exceptions=False)


def test_entries_are_added_listed_switched_and_removed(app_module: str) -> None:
    added = beat(
        "add", "-A", app_module, "every5", "proj.ping", "--every", "5s", "--args", "[1]", "--queue", "pings"
    )
    assert (added.exit_code, added.stdout) == (0, "added every5: proj.ping, every 5s\n")
    assert beat("add", "-A", app_module, "hourly", "proj.hourly", "--crontab", "0 * * * *").exit_code == 0
    listing = json.loads(beat("-A", app_module, "--list", "--json").stdout)
    assert listing["leader"] is None and listing["state_known"]
    shown = {entry["name"]: entry for entry in listing["entries"]}
    assert set(shown) == {"every5", "hourly", "nightly"}
    assert shown["every5"]["schedule"] == "every 5s" and shown["every5"]["source"] == "store"
    assert shown["nightly"]["schedule"] == "crontab 0 3 * * *" and shown["nightly"]["source"] == "settings"
    assert shown["hourly"]["next_run"].endswith(":00:00+00:00")
    assert beat("-A", app_module, "disable", "nightly").stdout == "disabled nightly\n"
    text = beat("-A", app_module, "--list").stdout
    assert "leader: none (no scheduler holds the lease)" in text
    [line] = [line for line in text.splitlines() if line.startswith("nightly")]
    assert "crontab 0 3 * * *  disabled" in line
    shown = {
        entry["name"]: entry
        for entry in json.loads(beat("-A", app_module, "--list", "--json").stdout)["entries"]
    }
    assert not shown["nightly"]["enabled"] and shown["nightly"]["next_run"] is None
    assert beat("-A", app_module, "enable", "nightly").exit_code == 0
    assert beat("-A", app_module, "remove", "every5").stdout == "removed every5\n"
    names = {
        entry["name"] for entry in json.loads(beat("-A", app_module, "--list", "--json").stdout)["entries"]
    }
    assert names == {"hourly", "nightly"}


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["add", "x", "proj.x", "--crontab", "61 * * * *"], "the crontab field minute takes 0-59"),
        (["add", "x", "proj.x"], "give one of --every SECONDS and --crontab"),
        (["add", "x", "proj.x", "--every", "soon"], "must be seconds, or a number with s, m, h or d"),
        (["add", "x", "proj.x", "--every", "5", "--options", '{"queues": "q"}'], "unknown option 'queues'"),
        (["add", "nightly", "proj.x", "--every", "5"], "'nightly' is an entry of the app's beat_schedule"),
        (["remove", "nightly"], "'nightly' comes from the app's beat_schedule: remove it there"),
        (["disable", "nope"], "there is no entry 'nope'"),
        (
            ["--scheduler", "redbeat.RedBeatScheduler", "--list"],
            "is a Celery scheduler class, which runs under celery",
        ),
    ],
)
def test_a_bad_change_is_refused_in_one_line(app_module: str, args: list[str], problem: str) -> None:
    where = args.index("--list") if "--list" in args else 1
    result = CliRunner().invoke(
        main,
        ["beat", "-A", app_module, *args]
        if where != 1 or args[0].startswith("-")
        else ["beat", args[0], "-A", app_module, *args[1:]],
    )
    assert result.exit_code == 2, result.output
    assert problem in result.stderr


def test_the_plugins_options_are_the_ones_the_core_names_when_the_plugin_is_missing() -> None:
    declared = {spec.flags for spec in worker_options()}
    expected = {entry.flags for entry in FROM_PLUGINS if entry.plugin == "beat"}
    assert declared == expected
    assert {entry.source for entry in FROM_PLUGINS if entry.plugin == "beat"} == {"./plugins/beat"}


def test_minus_b_without_the_plugin_says_what_to_do(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["worker", "-A", "apps.basic", "-B", "-p", "no:beat"])
    assert result.exit_code == 2
    assert (
        "-B/--beat runs the periodic-task scheduler in the worker, which the beat plugin adds"
        in result.stderr
    )
    assert "-p no:beat" in result.stderr

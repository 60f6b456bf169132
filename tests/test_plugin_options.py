"""A plugin's own options come from the command line, else ``WORKER_<OPTION_NAME>``, else the
``worker_plugin_options`` setting, else the option's default; each value goes through the option's
``convert``. Shown with the example plugin (``examples/plugin``) installed in a fake site."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, FakeSite
from workers import TESTS, wait_for

from worker_core import App
from worker_core.app.settings import Settings, check_environment
from worker_core.cli.group import main
from worker_core.exceptions import ConfigurationError

EXAMPLE = REPO / "examples" / "plugin" / "src"


@pytest.fixture
def liveness(site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    """The example plugin installed, and an app module ``opts_app`` whose settings the test writes."""
    # Its package is copied rather than put on the path: the source folder may hold the metadata
    # of an editable install, a second distribution of the same name.
    shutil.copytree(EXAMPLE / "worker_liveness", site.root / "worker_liveness")
    site.add("worker-liveness", {"worker.plugins": {"liveness": "worker_liveness.plugin"}})
    site.modules.update({"worker_liveness", "opts_app"})
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)
    yield site


def app_with(site: FakeSite, settings: dict) -> str:
    (site.root / "opts_app.py").write_text(
        "from worker_core import App\n"
        f"app = App('opts', broker='embedded://{site.root}/queue.db', result_backend='disabled')\n"
        f"app.conf.update(**{settings!r})\n"
    )
    sys.modules.pop("opts_app", None)
    return "opts_app"


def steps(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    result = CliRunner().invoke(main, ["steps", "-P", "solo", "--format", "json", *args], env=env,
                                catch_exceptions=False)
    if result.exit_code:
        return result.exit_code, {}, result.stderr
    described = {step["name"]: step["description"] for blueprint in json.loads(result.stdout)["blueprints"]
                 for step in blueprint["steps"] if step["enabled"]}
    return 0, described, result.stderr


def liveness_step(*args: str, env: dict[str, str] | None = None) -> str | None:
    code, described, err = steps(*args, env=env)
    assert code == 0, err
    return described.get("Liveness")


# -- where the values come from ----------------------------------------------------------------------


def test_without_any_source_the_option_has_its_default(liveness: FakeSite) -> None:
    assert liveness_step() is None  # liveness_file defaults to None: the step is left out


def test_an_options_variable_sets_it(liveness: FakeSite) -> None:
    described = liveness_step(env={"WORKER_LIVENESS_FILE": "/tmp/alive", "WORKER_LIVENESS_INTERVAL": "2"})
    assert described == "touch /tmp/alive every 2s"


def test_the_setting_sets_it_from_the_apps_configuration(liveness: FakeSite) -> None:
    options = {"liveness_file": "/tmp/alive", "liveness_interval": 3}
    app = app_with(liveness, {"worker_plugin_options": options})
    assert liveness_step("-A", app) == "touch /tmp/alive every 3s"


def test_the_setting_sets_it_from_its_json_variable(liveness: FakeSite) -> None:
    options = json.dumps({"liveness_file": "/tmp/alive", "liveness_interval": "4"})
    assert liveness_step(env={"WORKER_WORKER_PLUGIN_OPTIONS": options}) == "touch /tmp/alive every 4s"


@pytest.mark.parametrize(("command_line", "variable", "setting", "seconds"), [
    ("1", "2", 3, "1"),
    (None, "2", 3, "2"),
    (None, None, 3, "3"),
    (None, None, None, "5"),
    ("1", None, 3, "1"),
])
def test_the_command_line_wins_over_the_variable_over_the_setting_over_the_default(
        liveness: FakeSite, command_line: str | None, variable: str | None, setting: int | None,
        seconds: str) -> None:
    options: dict = {"liveness_file": "/tmp/alive"}
    if setting is not None:
        options["liveness_interval"] = setting
    env = {"WORKER_LIVENESS_INTERVAL": variable} if variable is not None else {}
    args = ["--liveness-interval", command_line] if command_line is not None else []
    app = app_with(liveness, {"worker_plugin_options": options})
    assert liveness_step("-A", app, *args, env=env) == f"touch /tmp/alive every {seconds}s"


def test_an_empty_variable_gives_the_default_over_the_setting(liveness: FakeSite) -> None:
    app = app_with(liveness, {"worker_plugin_options": {"liveness_file": "/tmp/alive"}})
    assert liveness_step("-A", app, env={"WORKER_LIVENESS_FILE": ""}) is None


@pytest.mark.parametrize(("env", "settings", "expected"), [
    ({"WORKER_TASK_EVENTS": "1"}, {}, "worker and task events"),
    ({"WORKER_TASK_EVENTS": "off"}, {"worker_plugin_options": {"task_events": True}}, "worker events"),
    ({}, {"worker_plugin_options": {"task_events": True}}, "worker and task events"),
    ({}, {}, "worker events"),
])
def test_a_flag_option_is_turned_on_or_off_by_its_variable_or_the_setting(
        liveness: FakeSite, env: dict[str, str], settings: dict, expected: str) -> None:
    code, described, err = steps("-A", app_with(liveness, settings), env=env)
    assert code == 0, err
    assert described["Events"].startswith(expected + " on the celeryev exchange")


# -- refusals --------------------------------------------------------------------------------------


def refusal(*args: str, env: dict[str, str] | None = None) -> str:
    code, _, err = steps(*args, env=env)
    assert code == 2, err
    [line] = [line for line in err.splitlines() if line.startswith("Error:")]
    return line


def test_a_bad_value_in_a_variable_names_the_variable_the_value_and_the_option(liveness: FakeSite) -> None:
    assert refusal(env={"WORKER_LIVENESS_INTERVAL": "-1"}) == (
        "Error: WORKER_LIVENESS_INTERVAL='-1' (--liveness-interval of plugin liveness "
        "(worker-liveness 1.0)): must be greater than 0 (got '-1')"
    )


def test_a_bad_value_in_the_setting_names_the_setting_the_value_and_the_option(liveness: FakeSite) -> None:
    app = app_with(liveness, {"worker_plugin_options": {"liveness_interval": "soon"}})
    assert refusal("-A", app) == (
        "Error: setting 'worker_plugin_options' gives liveness_interval='soon' (--liveness-interval of "
        "plugin liveness (worker-liveness 1.0)): could not convert string to float: 'soon'"
    )


def test_a_bad_value_in_the_json_variable_names_that_variable(liveness: FakeSite) -> None:
    line = refusal(env={"WORKER_WORKER_PLUGIN_OPTIONS": '{"liveness_interval": 0}'})
    assert line.startswith("Error: WORKER_WORKER_PLUGIN_OPTIONS gives liveness_interval=0 "
                           "(--liveness-interval")
    assert line.endswith("must be greater than 0 (got '0')")


@pytest.mark.parametrize(("value", "expected"), [
    ("maybe", "WORKER_TASK_EVENTS='maybe' (-E of plugin events (worker-core"),
])
def test_a_flag_variable_takes_only_yes_or_no(liveness: FakeSite, value: str, expected: str) -> None:
    line = refusal(env={"WORKER_TASK_EVENTS": value})
    assert expected in line and line.endswith("must be true or false, 1 or 0, yes or no, on or off")


def test_a_flag_in_the_setting_must_be_true_or_false(liveness: FakeSite) -> None:
    line = refusal("-A", app_with(liveness, {"worker_plugin_options": {"task_events": "yes"}}))
    assert "setting 'worker_plugin_options' gives task_events='yes' (-E of plugin events" in line
    assert line.endswith("which must be true or false (got a str)")


def test_a_name_no_plugin_declares_is_refused_with_the_declared_names(liveness: FakeSite) -> None:
    line = refusal("-A", app_with(liveness, {"worker_plugin_options": {"liveness_fil": "/tmp/alive"}}))
    assert line.startswith("Error: setting 'worker_plugin_options' names 'liveness_fil', which no installed "
                           "plugin declares as an option. Did you mean 'liveness_file'? Declared options: ")
    declared = line.partition("Declared options: ")[2].split(", ")
    assert declared == sorted(declared)
    expected = {"heartbeat_interval", "liveness_file", "liveness_interval", "metrics_listen", "task_events"}
    assert expected <= set(declared)


def test_a_name_whose_plugin_is_blocked_is_refused_naming_the_blocked_plugin(liveness: FakeSite) -> None:
    app = app_with(liveness, {"worker_plugin_options": {"liveness_file": "/tmp/alive"}})
    line = refusal("-A", app, "-p", "no:liveness")
    assert "names 'liveness_file', which no installed plugin declares" in line
    assert line.endswith("blocked or broken plugins declare none (liveness): unblock or fix them, or remove "
                         "the name")


SECRET_PLUGIN = """
    from worker_core import OptionSpec, hookimpl

    def token(text):
        if not text.startswith("tk-"):
            raise ValueError(f"must start with tk- (got {text!r})")
        return text

    @hookimpl
    def worker_options():
        return [OptionSpec("api_token", ("--api-token",), convert=token, help="The service's token.")]
"""


def test_a_secret_options_bad_value_is_not_shown(liveness: FakeSite) -> None:
    liveness.add("token-plugin", {"worker.plugins": {"token": "token_plugin"}},
                 {"token_plugin": SECRET_PLUGIN})
    line = refusal(env={"WORKER_API_TOKEN": "hunter2-secret"})
    assert line == ("Error: WORKER_API_TOKEN='********' (--api-token of plugin token (token-plugin 1.0)): "
                    "must start with tk- (got '********')")
    app = app_with(liveness, {"worker_plugin_options": {"api_token": "hunter2-secret"}})
    assert "hunter2" not in refusal("-A", app)


def test_an_option_named_after_a_setting_is_refused(liveness: FakeSite) -> None:
    liveness.add("clash-plugin", {"worker.plugins": {"clash": "clash_plugin"}}, {"clash_plugin": """
        from worker_core import OptionSpec, hookimpl

        @hookimpl
        def worker_options():
            return [OptionSpec("result_expires", ("--keep-for",))]
    """})
    assert refusal() == ("Error: plugin clash (clash-plugin 1.0) declares option 'result_expires', whose "
                         "variable WORKER_RESULT_EXPIRES the core reads already; rename the option")


# -- the setting without plugins, and the variables' check --------------------------------------------


def test_clients_take_the_setting_without_loading_plugins_and_still_refuse_unknown_settings() -> None:
    app = App("client", broker="embedded:///nowhere", worker_plugin_options={"anything": 1})
    assert app.settings.worker_plugin_options == {"anything": 1}
    with pytest.raises(ConfigurationError, match=re.escape("unknown setting 'worker_plugin_option'. Did "
                                                           "you mean 'worker_plugin_options'?")):
        App("client", worker_plugin_option={"anything": 1})


def test_the_setting_must_map_names_to_values() -> None:
    with pytest.raises(ConfigurationError, match="setting 'worker_plugin_options' must be dict"):
        Settings(worker_plugin_options=["liveness_file"])
    with pytest.raises(ConfigurationError, match=r"must map option names to values, for example "
                                                 r"\{'liveness_file': '/tmp/alive'\} \(got the key 3\)"):
        Settings(worker_plugin_options={3: "x"})


def test_an_options_variable_close_to_a_setting_is_no_typo_once_the_options_are_known() -> None:
    environ = {"WORKER_SEND_TASK_EVENTS": "1"}  # close to WORKER_WORKER_SEND_TASK_EVENTS
    expected = "WORKER_SEND_TASK_EVENTS is not a setting. Did you mean WORKER_WORKER_SEND_TASK_EVENTS?"
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        check_environment(environ)
    check_environment(environ, plugin_options={"send_task_events"})
    check_environment(environ, plugin_options=lambda: {"send_task_events"})


def test_plugin_options_are_asked_for_only_when_a_variable_looks_like_a_typo() -> None:
    asked: list[int] = []

    def declared() -> set[str]:
        asked.append(1)
        return {"liveness_file"}

    unrelated = {"WORKER_BROKER_URL": "embedded://", "WORKER_SOMETHING_ELSE": "x"}
    check_environment(unrelated, plugin_options=declared)
    assert asked == []
    with pytest.raises(ConfigurationError, match=re.escape(
            "WORKER_WORKER_SEND_TASK_EVENT is not a setting or a plugin option. Did you mean "
            "WORKER_WORKER_SEND_TASK_EVENTS?")):
        check_environment({"WORKER_WORKER_SEND_TASK_EVENT": "1"}, plugin_options=declared)
    assert asked == [1]


def test_a_typo_of_an_options_variable_is_refused_with_the_right_name() -> None:
    with pytest.raises(ConfigurationError, match=re.escape(
            "WORKER_LIVENES_FILE is not a setting or a plugin option. Did you mean WORKER_LIVENESS_FILE?")):
        check_environment({"WORKER_LIVENES_FILE": "/tmp/a"}, plugin_options={"liveness_file"})


# -- real processes -------------------------------------------------------------------------------------


def test_a_worker_takes_its_plugins_options_from_the_environment(liveness: FakeSite, workers,
                                                                  tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    path = os.pathsep.join([str(liveness.root), str(TESTS)])
    workers.start(broker=f"embedded://{tmp_path}/queue.db", env={
        "PYTHONPATH": path, "WORKER_LIVENESS_FILE": str(alive), "WORKER_LIVENESS_INTERVAL": "0.2",
        "WORKER_TASK_EVENTS": "1"})
    wait_for(alive.exists, message="the liveness file")
    first = alive.stat().st_mtime_ns
    wait_for(lambda: alive.stat().st_mtime_ns > first, message="the liveness file touched again")


def test_a_client_accepts_a_flag_options_variable_close_to_a_setting(tmp_path: Path) -> None:
    import subprocess

    env = {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}
    env.update(PYTHONPATH=str(TESTS), WORKER_BROKER_URL=f"embedded://{tmp_path}/queue.db",
               WORKER_TASK_EVENTS="1")
    done = subprocess.run([sys.executable, "-m", "worker_core", "call", "-A", "apps.basic", "apps.basic.add"],
                          cwd=TESTS, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    env["WORKER_TASK_EVENT"] = env.pop("WORKER_TASK_EVENTS")
    done = subprocess.run([sys.executable, "-m", "worker_core", "call", "-A", "apps.basic", "apps.basic.add"],
                          cwd=TESTS, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "Error: WORKER_TASK_EVENT is not a setting or a plugin option. Did you mean WORKER_TASK_EVENTS?" \
        in done.stderr

"""``workerctl steps`` and ``workerctl plugins`` as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from worker_core.cli import main


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def steps_json(*args: str) -> dict:
    code, out, err = run("steps", "--format", "json", *args)
    assert code == 0, err
    return {bp["name"]: bp for bp in json.loads(out)["blueprints"]}


def test_steps_lists_the_start_order_with_plugin_and_distribution():
    code, out, _ = run("steps", "-P", "solo")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "worker blueprint, start order:"
    assert "1. Timer" in lines[1] and "worker (worker-core" in lines[1]
    assert "⧉Consumer" in out and "⧉Loop" in out
    assert "pool: solo (worker-core" in out


def test_threads_and_autoscale_show_the_threads_pool_and_the_autoscaler():
    worker = steps_json("-P", "threads", "--autoscale", "4,1")["worker"]
    assert worker["order"] == ["Timer", "Pool", "Autoscaler", "Consumer"]
    pool = next(s for s in worker["steps"] if s["name"] == "Pool")
    assert pool["implementation"].startswith("threads (worker-pool-threads")
    autoscaler = next(s for s in worker["steps"] if s["name"] == "Autoscaler")
    assert autoscaler["conditional"] and autoscaler["enabled"]


def test_without_autoscale_there_is_no_autoscaler():
    worker = steps_json("-P", "threads")["worker"]
    assert "Autoscaler" not in worker["order"]
    left_out = {s["name"]: s["disabled_reason"] for s in worker["steps"] if not s["enabled"]}
    assert left_out["Autoscaler"] == "only when --autoscale is given"


def test_the_hub_is_part_of_the_worker_only_under_the_async_loop():
    assert "Hub" not in steps_json("-P", "solo")["worker"]["order"]  # embedded: sync loop
    assert "Hub" in steps_json("-P", "solo", "-b", "redis://127.0.0.1:6379/0")["worker"]["order"]
    assert "Hub" not in steps_json(
        "-P", "solo", "-b", "redis://127.0.0.1:6379/0", "--loop", "sync"
    )["worker"]["order"]


def test_graph_is_dot_by_default_and_marks_last_conditional_and_provider():
    code, out, _ = run("steps", "--graph", "-P", "threads", "--autoscale", "4,1")
    assert code == 0
    assert out.startswith("digraph bootsteps {") and out.rstrip().endswith("}")
    assert '"worker:Pool" -> "worker:Timer";' in out
    assert "∘Autoscaler" in out and "when --autoscale is given" in out
    assert 'shape="parallelogram"' in out and "last step" in out
    assert "pool: threads (worker-pool-threads" in out
    assert "from worker (worker-core" in out


@pytest.mark.skipif(shutil.which("dot") is None and not os.environ.get("CI"),
                    reason="Graphviz is not installed (CI installs it)")
def test_the_dot_output_renders_with_graphviz(tmp_path):
    code, out, _ = run("steps", "--graph", "-P", "threads", "--autoscale", "4,1")
    assert code == 0
    picture = tmp_path / "steps.png"
    subprocess.run(["dot", "-Tpng", "-o", str(picture)], input=out.encode(), check=True)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mermaid_and_text_formats():
    code, out, _ = run("steps", "--graph", "--format", "mermaid", "-P", "solo")
    assert code == 0 and out.startswith("flowchart BT")
    assert "worker_Pool --> worker_Timer" in out
    code, out, _ = run("steps", "--graph", "--format", "text", "-P", "solo")
    assert code == 0 and "start order" in out


def test_bad_options_give_one_line_errors_and_status_2():
    for args, expected in [
        (["-P", "nothere"], "no pool named 'nothere'"),
        (["--autoscale", "x"], "--autoscale must be MAX[,MIN]"),
        (["-c", "-1"], "--concurrency must be 0 or more"),
        (["-p", "no:worker"], "essential"),
        (["--loop", "async"], "does not"),
    ]:
        code, out, err = run("steps", *args)
        assert code == 2, args
        assert expected in err, (args, err)
        assert "Traceback" not in err and out == ""


def test_plugins_lists_every_plugin_with_status_and_json():
    code, out, _ = run("plugins")
    assert code == 0
    header = out.splitlines()[0].split()
    assert header[:5] == ["NAME", "KIND", "DISTRIBUTION", "VERSION", "STATUS"]
    code, out, _ = run("plugins", "--json")
    rows = json.loads(out)
    solo = next(r for r in rows if r["kind"] == "pool" and r["name"] == "solo")
    assert solo["distribution"] == "worker-core" and solo["status"] == "loaded"
    worker = next(r for r in rows if r["kind"] == "hooks" and r["name"] == "worker")
    assert worker["hooks"] == ["worker_bootsteps"]


def test_plugins_shows_blocked_and_failed_plugins(site):
    site.add("bad-pool", {"worker.pools": {"bad": "bad_pool:Pool"}}, {"bad_pool": "import nope_nope\n"})
    code, out, _ = run("plugins", "--json", "-p", "no:threads")
    assert code == 0
    rows = {(r["kind"], r["name"]): r for r in json.loads(out)}
    assert rows[("pool", "threads")]["status"] == "blocked"
    assert rows[("pool", "bad")]["status"] == "failed"
    assert "nope_nope" in rows[("pool", "bad")]["reason"]


def test_a_broken_plugin_the_command_does_not_need_is_a_warning_not_a_failure(site):
    site.add("broken-plugin", {"worker.plugins": {"broken": "broken_mod"}}, {"broken_mod": "1/0\n"})
    code, out, err = run("steps", "-P", "solo")
    assert code == 0 and "Timer" in out
    assert "warning: plugin 'broken' (broken-plugin 1.0" in err and "ZeroDivisionError" in err


def test_a_plugin_step_and_option_appear_in_steps(site):
    site.add("audit-plugin", {"worker.plugins": {"audit": "audit_plugin"}}, {"audit_plugin": """
        from worker_core import Condition, OptionSpec, Step, hookimpl

        class Audit(Step):
            name = "Audit"
            requires = ("Pool",)
            condition = Condition("--audit-level is given", lambda o: o.extra.get("audit_level") is not None)

            def describe(self, options):
                return f"audit level {options.extra['audit_level']}"

        @hookimpl
        def worker_options():
            return [OptionSpec("audit_level", ("--audit-level",), convert=int, help="How much to audit.")]

        @hookimpl
        def worker_bootsteps(blueprint):
            return [Audit()] if blueprint == "worker" else []
        """})
    assert "Audit" not in steps_json("-P", "solo")["worker"]["order"]
    worker = steps_json("-P", "solo", "--audit-level", "3")["worker"]
    assert worker["order"] == ["Timer", "Pool", "Audit", "Consumer"]
    audit = next(s for s in worker["steps"] if s["name"] == "Audit")
    assert audit["distribution"] == "audit-plugin" and audit["description"] == "audit level 3"
    code, _, err = run("steps", "-P", "solo", "--audit-level", "high")
    assert code == 2 and "--audit-level" in err


def test_the_failback_step_is_part_of_the_consumer_only_with_several_brokers():
    one = steps_json("-P", "solo", "-b", "redis://127.0.0.1:6379/0")["consumer"]
    assert "Failback" not in one["order"]
    left_out = {s["name"]: s["disabled_reason"] for s in one["steps"] if not s["enabled"]}
    assert left_out["Failback"] == "only when several broker URLs are given"
    several = steps_json("-P", "solo", "-b", "redis://a:6379/0;redis://b:6379/0", "--failover", "priority")
    order = several["consumer"]["order"]
    assert order.index("Connection") < order.index("Failback") < order.index("Loop")

"""Loading plugins: isolation of broken ones, blocking, conflicts, missing names, bad hooks."""

from __future__ import annotations

import logging

import pytest

from worker_core.exceptions import (
    PluginBlockedError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
    PluginNotFoundError,
)
from worker_core.plugins import PluginManager

GOOD_STEP_PLUGIN = """
from worker_core import Step, hookimpl

class Audit(Step):
    name = "Audit"
    requires = ("Pool",)

@hookimpl
def worker_bootsteps(blueprint):
    return [Audit()] if blueprint == "worker" else []
"""


def test_core_plugins_are_registered_through_their_entry_points():
    manager = PluginManager()
    registered = manager.registered_names()
    assert registered["worker"] is not None and registered["worker"].distribution == "worker-core"
    assert registered["consumer"] is not None
    steps, providers = manager.bootsteps("worker")
    core = {step.name: provider for step, provider in zip(steps, providers, strict=True)}
    assert {"Timer", "Hub", "Pool", "Autoscaler", "Consumer"} <= set(core)
    assert core["Timer"].plugin == "worker" and core["Timer"].distribution == "worker-core"


def test_a_plugin_that_fails_to_import_is_isolated_and_reported(site):
    site.add(
        "broken-plugin",
        {"worker.plugins": {"broken": "broken_mod"}},
        {"broken_mod": "import no_such_module_anywhere\n"},
        version="3.1",
    )
    site.add("good-plugin", {"worker.plugins": {"audit": "audit_mod"}}, {"audit_mod": GOOD_STEP_PLUGIN})
    manager = PluginManager()
    # the good plugin still contributes its step
    steps, _ = manager.bootsteps("worker")
    assert "Audit" in [s.name for s in steps]
    [failure] = manager.failures()
    assert "'broken'" in failure
    assert "broken-plugin 3.1" in failure
    assert "entry point worker.plugins: broken = broken_mod" in failure
    assert "ModuleNotFoundError" in failure and "no_such_module_anywhere" in failure
    status = {s.entry.name: s for s in manager.statuses()}
    assert status["broken"].status == "failed"
    assert status["audit"].status == "loaded" and status["audit"].hooks == ("worker_bootsteps",)


def test_a_plugin_raising_at_import_or_exiting_is_isolated_too(site):
    site.add("exploding", {"worker.plugins": {"boom": "boom_mod"}}, {"boom_mod": "raise SystemExit(3)\n"})
    manager = PluginManager()
    assert any("'boom'" in line and "SystemExit" in line for line in manager.failures())


def test_blocking_a_plugin_keeps_it_from_being_imported(site):
    site.add("side-effects", {"worker.plugins": {"noisy": "noisy_mod"}},
             {"noisy_mod": "raise RuntimeError('imported although blocked')\n"})
    manager = PluginManager(blocked=["noisy"])
    assert manager.failures() == []
    assert {s.entry.name: s.status for s in manager.statuses()}["noisy"] == "blocked"


def test_essential_plugins_refuse_to_be_blocked():
    with pytest.raises(PluginBlockedError, match="essential to worker-core"):
        PluginManager(blocked=["consumer"])


def test_blocking_an_unknown_name_is_an_error_with_a_suggestion():
    with pytest.raises(PluginNotFoundError, match="Did you mean 'solo'"):
        PluginManager(blocked=["sollo"])


def test_a_blocked_pool_cannot_be_chosen_and_the_message_says_what_to_do():
    manager = PluginManager(blocked=["solo"])
    assert "solo" not in manager.names("pool")
    with pytest.raises(PluginBlockedError) as caught:
        manager.slot("pool", "solo")
    assert "-p no:solo" in str(caught.value) and "worker-core" in str(caught.value)


def test_a_name_nobody_provides_lists_what_is_available_and_what_to_install():
    manager = PluginManager()
    with pytest.raises(PluginNotFoundError) as caught:
        manager.slot("pool", "gevent")
    message = str(caught.value)
    assert "no pool named 'gevent'" in message
    assert "solo (worker-core)" in message


def test_a_known_name_that_is_not_installed_says_which_distribution_to_install(site, monkeypatch):
    manager = PluginManager()
    monkeypatch.setattr(manager, "entries", lambda kind: [e for e in PluginManager.entries(manager, kind)
                                                          if e.name != "prefork"])
    hint = r"pip install \./plugins/pool_prefork \(worker-pool-prefork"
    with pytest.raises(PluginNotFoundError, match=hint):
        manager.slot("pool", "prefork")


def test_two_distributions_claiming_one_pool_name_are_named_in_the_error(site):
    for dist in ("acme-pool", "other-pool"):
        module = dist.replace("-", "_") + "_mod"
        site.add(dist, {"worker.pools": {"turbo": f"{module}:Pool"}}, {module: "class Pool: pass\n"})
    manager = PluginManager()
    with pytest.raises(PluginConflictError) as caught:
        manager.slot("pool", "turbo")
    message = str(caught.value)
    assert "acme-pool" in message and "other-pool" in message
    assert "pip uninstall" in message
    manager.load_all_slots()
    assert {s.status for s in manager.statuses() if s.entry.name == "turbo"} == {"conflict"}


def test_two_hook_plugins_with_one_name_are_both_refused_and_reported(site):
    for dist in ("first-audit", "second-audit"):
        module = dist.replace("-", "_")
        site.add(dist, {"worker.plugins": {"audit": module}}, {module: GOOD_STEP_PLUGIN})
    manager = PluginManager()
    steps, _ = manager.bootsteps("worker")
    assert "Audit" not in [s.name for s in steps]
    [line] = manager.failures()
    assert "first-audit" in line and "second-audit" in line


def test_only_the_chosen_slot_implementation_is_imported(site):
    site.add("lazy-pools", {"worker.pools": {"lazy": "lazy_pool:Pool", "other": "other_pool:Pool"}},
             {"lazy_pool": "from worker_core.pools.solo import SoloPool\nclass Pool(SoloPool): pass\n",
              "other_pool": "raise RuntimeError('should not be imported')\n"})
    import sys

    manager = PluginManager()
    assert manager.slot("pool", "lazy").__name__ == "Pool"
    assert "other_pool" not in sys.modules


def test_a_slot_that_fails_to_import_names_entry_point_distribution_and_cause(site):
    site.add("bad-pool", {"worker.pools": {"bad": "bad_pool:Pool"}}, {"bad_pool": "1/0\n"}, version="0.9")
    manager = PluginManager()
    with pytest.raises(PluginLoadError) as caught:
        manager.slot("pool", "bad")
    message = str(caught.value)
    assert "bad-pool 0.9" in message and "bad_pool:Pool" in message and "ZeroDivisionError" in message


def test_a_hook_implementation_with_no_spec_is_refused_with_a_suggestion(site):
    site.add("typo-plugin", {"worker.plugins": {"typo": "typo_mod"}}, {"typo_mod": """
        from worker_core import hookimpl

        @hookimpl
        def worker_bootstep(blueprint):
            return []
        """})
    manager = PluginManager()
    [line] = manager.failures()
    assert "worker_bootstep" in line and "Did you mean 'worker_bootsteps'" in line


def test_a_hook_with_wrong_arguments_is_refused(site):
    site.add("wrong-args", {"worker.plugins": {"wrongargs": "wrongargs_mod"}}, {"wrongargs_mod": """
        from worker_core import hookimpl

        @hookimpl
        def worker_bootsteps(blueprint, nonsense):
            return []
        """})
    manager = PluginManager()
    [line] = manager.failures()
    assert "'wrongargs'" in line and "nonsense" in line


def test_a_plugin_returning_something_other_than_steps_is_named(site):
    site.add("bad-steps", {"worker.plugins": {"badsteps": "badsteps_mod"}}, {"badsteps_mod": """
        from worker_core import Step, hookimpl

        @hookimpl
        def worker_bootsteps(blueprint):
            return [Step] if blueprint == "worker" else []
        """})
    manager = PluginManager()
    with pytest.raises(PluginError) as caught:
        manager.bootsteps("worker")
    assert "badsteps (bad-steps 1.0)" in str(caught.value) and "instantiate it" in str(caught.value)


def test_an_observer_that_raises_is_logged_and_the_others_still_run(site, caplog):
    site.add("observers", {"worker.plugins": {"loud": "loud_mod", "quiet": "quiet_mod"}}, {
        "loud_mod": """
            from worker_core import hookimpl
            @hookimpl
            def worker_ready(worker):
                raise RuntimeError("observer failed")
        """,
        "quiet_mod": """
            from worker_core import hookimpl
            seen = []
            @hookimpl
            def worker_ready(worker):
                seen.append(worker)
        """,
    })
    manager = PluginManager()
    with caplog.at_level(logging.ERROR, logger="worker.plugins"):
        manager.notify("worker_ready", worker="w1")
    import quiet_mod

    assert quiet_mod.seen == ["w1"]
    assert "plugin loud raised in worker_ready" in caplog.text

"""The names ``worker_core`` exports: pinned, so the public API changes only on purpose."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import worker_core

PUBLIC = [
    "App",
    "AsyncResult",
    "Condition",
    "GroupResult",
    "OptionSpec",
    "Request",
    "ResultSet",
    "ResultTimeout",
    "Settings",
    "Signature",
    "Stash",
    "StashKey",
    "Step",
    "Task",
    "Worker",
    "WorkerOptions",
    "chain",
    "chord",
    "chunks",
    "group",
    "hookimpl",
    "maybe_signature",
    "signature",
    "xmap",
    "xstarmap",
]


def test_the_exported_names_are_exactly_the_pinned_ones() -> None:
    assert worker_core.__all__ == PUBLIC


#: where each exported name is defined
HOMES = {
    "App": "app", "AsyncResult": "app", "Settings": "app", "Task": "app",
    "GroupResult": "app.groupresult", "ResultSet": "app.groupresult",
    "Condition": "bootsteps", "Step": "bootsteps",
    "Signature": "canvas", "chain": "canvas", "chord": "canvas", "chunks": "canvas", "group": "canvas",
    "maybe_signature": "canvas", "signature": "canvas", "xmap": "canvas", "xstarmap": "canvas",
    "ResultTimeout": "exceptions",
    "hookimpl": "hookspecs",
    "OptionSpec": "options", "WorkerOptions": "options",
    "Request": "request", "Stash": "stash", "StashKey": "stash", "Worker": "worker.worker",
}


@pytest.mark.parametrize("name", PUBLIC)
def test_every_exported_name_is_the_object_its_module_defines(name: str) -> None:
    home = importlib.import_module(f"worker_core.{HOMES[name]}")
    assert getattr(worker_core, name) is getattr(home, name)
    assert name in dir(worker_core)


def test_result_timeout_is_the_error_a_result_wait_raises() -> None:
    from worker_core.exceptions import ResultTimeout, WorkerError

    assert worker_core.ResultTimeout is ResultTimeout
    assert issubclass(worker_core.ResultTimeout, WorkerError)


def test_star_import_gives_every_exported_name() -> None:
    namespace: dict[str, object] = {}
    exec("from worker_core import *", namespace)
    assert sorted(set(namespace) - {"__builtins__"}) == sorted(PUBLIC)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="module 'worker_core' has no attribute 'Nope'"):
        worker_core.Nope  # noqa: B018


def test_importing_the_package_and_its_errors_does_not_import_kombu() -> None:
    """Plugins that only declare steps or catch an error should not pay for the tasks API."""
    script = ("import sys, worker_core; worker_core.ResultTimeout; worker_core.OptionSpec; "
              "print('kombu' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


#: what each public module of the core and each plugin package exports
MODULES = {
    "worker_core.stash": ["Stash", "StashKey"],
    "worker_core.canvas": ["Embed", "Signature", "apply_to_result", "chain", "chord", "chunks", "from_dict",
                           "group", "maybe_signature", "send_callbacks", "send_errbacks", "send_next_step",
                           "signature", "xmap", "xstarmap"],
    "worker_core.fastpaths": ["Check", "Decision", "FastPath", "FastPaths", "Library", "STOCK_VARIABLE",
                              "attribute", "decide", "reads", "report", "signature"],
    "worker_pool_prefork": ["PreforkPool"],
    "worker_pool_threads": ["ThreadPool"],
    "worker_transport_amqp": ["AmqpTransport"],
    "worker_transport_redis": ["RedisBackend", "RedisTransport"],
    "worker_autoscale_backlog": ["BacklogAutoscaler"],
    "worker_celery": ["CeleryApp", "CeleryLoader", "CeleryResultBackend"],
    "worker_metrics_prometheus": ["MetricsStep", "parse_listen"],
    "worker_metrics_prometheus.metrics": ["TaskMetrics", "WorkerGauges"],
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_plugin_package_and_public_module_exports_its_pinned_names(module: str) -> None:
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == MODULES[module]
    for name in imported.__all__:
        assert getattr(imported, name) is not None


def test_the_hook_specs_are_pinned() -> None:
    from worker_core import hookspecs

    specs = sorted(name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "worker_spec"))
    assert specs == sorted([
        "after_task_publish", "before_task_publish", "heartbeat_sent", "task_failed", "task_failure",
        "task_postrun", "task_prerun", "task_received", "task_rejected", "task_retried", "task_retry",
        "task_revoked", "task_started", "task_succeeded", "task_success", "worker_bootsteps",
        "worker_control_commands", "worker_init", "worker_options", "worker_process_init",
        "worker_process_shutdown", "worker_ready", "worker_shutdown", "worker_shutting_down",
        "worker_stopped", "worker_validate_options",
    ])
    assert set(specs) == hookspecs.OBSERVER_HOOKS | hookspecs.CONTRIBUTION_HOOKS


def test_worker_core_never_imports_celery() -> None:
    """Every module of worker-core imported, and a worker of this project's App run: no Celery
    (worker-celery is the one distribution that depends on it)."""
    script = """
import pkgutil, importlib, sys
import worker_core
for module in pkgutil.walk_packages(worker_core.__path__, "worker_core."):
    if not module.name.endswith("__main__"):
        importlib.import_module(module.name)
from worker_core.app.loader import load_app
load_app("apps.basic")
print(sorted(name for name in sys.modules if name == "celery" or name.startswith("celery.")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=__import__("conftest").REPO / "tests")
    assert out.stdout.strip() == "[]"


def test_worker_celery_imports_no_celery_until_a_celery_app_is_loaded() -> None:
    """Its hooks are loaded by every workerctl worker: a worker of this project's App must not pay
    for importing Celery."""
    script = ("import sys, worker_celery, worker_celery.plugin; "
              "print(sorted(m for m in sys.modules if m == 'celery' or m.startswith('celery.')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

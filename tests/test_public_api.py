"""The names ``worker_core`` exports: pinned, so the public API changes only on purpose."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

import worker_core

PUBLIC = [
    "App",
    "AsyncResult",
    "Condition",
    "ControlCommand",
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
    "Condition": "bootsteps", "Step": "bootsteps", "ControlCommand": "control.command",
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


#: what each public module of the core and each plugin package exports: for the core, the
#: plugin author's whole API (``worker_core``'s docstring lists these modules)
MODULES = {
    "worker_core.stash": ["Stash", "StashKey"],
    "worker_core.aio": ["BlockingThreads", "Interruptible", "async_form", "blocking_executor",
                        "register_async_form", "run_coroutine", "set_blocking_executor", "thread_loop"],
    "worker_core.health": ["BOOTING", "BROKER_BLOCKED", "BROKER_DISCONNECTED", "CONSUMER_STALLED", "DRAINING",
                           "Health", "LIVE", "Listener", "ListenerSecurity", "PROBE_PATHS", "READINESS_ORDER",
                           "SERVING", "STARTING", "STUCK", "Verdict", "address_of", "listener_security",
                           "parse_listen", "probe_app", "probe_response", "serve"],
    "worker_core.canvas": ["Embed", "Signature", "apply_to_result", "chain", "chord", "chunks", "from_dict",
                           "group", "maybe_signature", "send_callbacks", "send_errbacks", "send_next_step",
                           "signature", "xmap", "xstarmap"],
    "worker_core.election": ["Duty", "ELECTIONS", "Election", "check_lease", "track", "untrack"],
    "worker_core.fastpaths": ["Check", "Decision", "FastPath", "FastPaths", "Library", "STOCK_VARIABLE",
                              "attribute", "decide", "reads", "report", "signature"],
    "worker_core.exceptions": [
        "AppImportError", "BackendDisabled", "BrokerStorageError", "CanvasError", "ChordError",
        "ConfigurationError", "ConnectionLostError", "ContentDisallowed", "DecodeError", "Ignore",
        "JobWithdrawn", "LeaseLost", "MaxRetriesExceededError", "NotImplementedYet", "NotRegistered",
        "PluginBlockedError",
        "PluginConflictError", "PluginError", "PluginLoadError", "PluginNotFoundError", "PoolError",
        "ProtocolError", "Reject", "ResultDecodeError", "ResultError", "ResultTimeout", "Retry",
        "SecurityError", "SoftTimeLimitExceeded", "StepConflictError", "StepCycleError", "StepError",
        "StepMissingError", "TaskError", "TaskRevokedError", "TimeLimitExceeded", "TopologyError",
        "TransportError", "UnpicklableError", "WorkerError", "WorkerLostError", "WorkerTerminate",
        "where_it_failed"],
    "worker_core.hookspecs": ["CONTRIBUTION_HOOKS", "Gauge", "OBSERVER_HOOKS", "PROJECT", "hookimpl",
                              "hookspec"],
    "worker_core.slots": [
        "AcceptCallback", "AcksSurviveReconnect", "AdoptsQueues", "AppLoader", "Autoscaler",
        "AutoscalerFactory", "BackendCountsDeliveries", "BrokerStatus", "BuffersDeliveries", "CAPABILITIES",
        "ChordCount", "ConnectFailure", "CountsDeliveries", "DelaysOnBroker", "DiscardsResults",
        "ElectsLeaders", "EventLoop", "ExplainsConnectFailures", "FailoverStrategy", "FansOutEvents",
        "FencesLeases", "FixedConcurrency", "ForeignApp", "JoinsChords", "KeepsRecords", "Lease",
        "LeaseState", "LeasesMessages", "ListsConfiguration", "LoopContext", "OffersResultBackend",
        "OrdersByPriority", "ParksMessages", "Pool",
        "PoolFactory", "PoolOptions", "REQUIRED", "RecordTable", "RepliesToSender", "ReportsRefusals",
        "RestartsProcesses", "ResultBackend", "RewritesUrls", "SavesGroups", "SendsOnce", "SharesOneQueue",
        "StopsOneJob", "SuccessIsFinal", "TellsTime", "Transport", "WithdrawsOneJob", "WithdrawsQueuedJobs"],
    "worker_core.options": ["Autoscale", "LOGLEVELS", "OptionSpec", "SCHEDULING", "WorkerOptions",
                            "did_you_mean", "parse_autoscale", "parse_brokers", "parse_hostname",
                            "parse_queues", "scheme_of"],
    "worker_core.redaction": ["MASK", "SecretFilter", "install_secret_filter", "is_secret_name",
                              "redact_text", "redact_url", "redact_value", "secrets_of"],
    "worker_core.protocol": ["DELAY_LEVELS", "DELIVERY_EXCHANGE", "JSON", "LOST_HEADER", "OutgoingMessage",
                             "TaskEnvelope", "custom_headers", "decode_task", "origin_name", "parse_iso",
                             "safe_repr", "safe_repr_as_built", "shown", "strip_delay", "task_message",
                             "to_iso", "utcnow"],
    "worker_core.protocol.fastjson": ["dumps", "loads"],
    "worker_core.protocol.packing": ["PackError", "pack", "unpack"],
    "worker_core.results": ["EXCEPTION_STATES", "FAILURE", "IGNORED", "Outcome", "PENDING",
                            "PROPAGATE_STATES", "READY_STATES", "RECEIVED", "REJECTED", "RETRY", "REVOKED",
                            "ResultCodec", "STARTED", "SUCCESS", "UNREADY_STATES", "decode_exception",
                            "decode_result", "encode_exception", "make_meta", "pending_meta",
                            "store_outcome"],
    "worker_core.transports.message": ["Message", "Unreadable", "envelope_problem", "fresh_tag",
                                       "tag_problem"],
    "worker_core.autoscale": ["DemandAutoscaler"],
    "worker_core.testing": ["JobProbe", "PoolRunner", "jobs", "lease_contract", "pool_contract",
                            "result_backend_contract", "transport_contract"],
    "worker_core.testing.lease_contract": ["CHECKS", "Check", "SLACK", "TTL", "check_name", "run_all"],
    "worker_core.testing.pool_contract": ["CHECKS", "Check", "OPTIONS", "check_name", "run_all"],
    "worker_core.testing.transport_contract": ["CHECKS", "Check", "check_name", "run_all"],
    "worker_core.testing.result_backend_contract": ["CHECKS", "Check", "applies", "check_name",
                                                    "full_request", "run_all"],
    "worker_core.testing.proxy": ["TcpProxy", "proxied"],
    "worker_core.testing.runner": ["JobProbe", "PoolRunner"],
    "worker_core.testing.jobs": ["add", "allocate", "append_line", "busy_sleep", "catch_soft_limit", "echo",
                                 "fail", "initializations", "mark_initialized", "noop", "sleep", "touch",
                                 "wait_for_path", "whoami", "whoami_after"],
    "worker_pool_asyncio": ["AsyncioPool"],
    "worker_pool_prefork": ["PreforkPool"],
    "worker_pool_threads": ["ThreadPool"],
    "worker_transport_amqp": ["AmqpTransport"],
    "worker_transport_redis": ["RedisBackend", "RedisTransport"],
    "worker_transport_postgres": ["PostgresBackend", "PostgresTransport", "enqueue_in"],
    "worker_transport_redis_cluster": ["RedisClusterBackend", "RedisClusterTransport"],
    "worker_autoscale_backlog": ["BacklogAutoscaler"],
    "worker_beat": ["BeatService", "ScheduleSource", "crontab", "every"],
    "worker_celery": ["CeleryApp", "CeleryLoader", "CeleryResultBackend"],
    "worker_metrics_prometheus": ["MetricsStep", "parse_listen"],
    "worker_metrics_prometheus.metrics": ["TaskMetrics", "WorkerGauges"],
    "worker_otel": ["PublishTracing", "TaskTracing", "instrument", "uninstrument"],
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_plugin_package_and_public_module_exports_its_pinned_names(module: str) -> None:
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == MODULES[module]
    for name in imported.__all__:
        assert getattr(imported, name) is not None


# -- the built-in plugins are third-party plugins that happen to live here ---------------------

#: the core's public API: each public module and the names it exports
CORE_API = {"worker_core": PUBLIC, **{module: names for module, names in MODULES.items()
                                      if module.partition(".")[0] == "worker_core"}}

#: every built-in plugin package, the core's own transport, written as a plugin would be, and the
#: test transport that proves one needs nothing else (``tests/memory_transport.py``)
BUILT_INS = sorted(
    [(path.name, path) for path in REPO.glob("plugins/*/src/*") if (path / "__init__.py").exists()]
    + [("worker_core.transports.embedded", REPO / "core/src/worker_core/transports/embedded"),
       ("memory_transport", REPO / "tests/memory_transport.py")]
)


def _module_of(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def core_imports(root: Path, package: str) -> list[tuple[str, str, str | None]]:
    """Every core module and name the modules of ``package`` (the folder ``root``, or one file) import, as
    ``(where, module, name)`` (``name`` None for ``import module``), imports inside ``package``
    left out."""
    found: list[tuple[str, str, str | None]] = []
    for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
        here = package.split(".") if root.is_file() else _module_of(path, root, package).split(".")
        if path.name != "__init__.py":
            here.pop()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [(where, alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                module = ".".join([*base, node.module] if node.module else base)
                found += [(where, module, alias.name) for alias in node.names]
    inside = (package, f"{package}.")
    return [(where, module, name) for where, module, name in found
            if module.partition(".")[0] == "worker_core" and not module.startswith(inside)
            and not (module == package.rpartition(".")[0] and f"{module}.{name}".startswith(inside))]


def outside_the_public_api(module: str, name: str | None) -> bool:
    if name is not None and f"{module}.{name}" in CORE_API:
        return False  # a public module, imported from its package
    if module not in CORE_API:
        return True
    return name is not None and name not in CORE_API[module]


@pytest.mark.parametrize(("package", "root"), BUILT_INS, ids=[package for package, _ in BUILT_INS])
def test_every_built_in_plugin_imports_only_the_public_core_api(package: str, root: Path) -> None:
    imports = core_imports(root, package)
    assert imports, f"{package} imports nothing of the core: the check reads the wrong files"
    wrong = [f"{where}: {module}{'.' + name if name else ''}" for where, module, name in imports
             if outside_the_public_api(module, name)]
    assert not wrong, (
        f"{package} imports core names outside the public API (make them public on purpose, in a "
        f"module worker_core's docstring lists and MODULES pins, or stop using them):\n" + "\n".join(wrong))


def test_the_import_check_refuses_a_private_module_a_private_name_and_a_deep_import(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(
        "from worker_core import App, exceptions\n"
        "from worker_core.results import SUCCESS\n"
        "from worker_core.results.meta import make_meta\n"
        "from worker_core.redaction import _SECRET\n"
        "from worker_core.transports import message, embedded\n"
        "import worker_core.app.base\n"
        "from . import helpers\n"
    )
    imports = core_imports(plugin, "plugin")
    assert [(module, name) for _, module, name in imports if outside_the_public_api(module, name)] == [
        ("worker_core.results.meta", "make_meta"), ("worker_core.redaction", "_SECRET"),
        ("worker_core.transports", "embedded"), ("worker_core.app.base", None)]


def test_the_hook_specs_are_pinned() -> None:
    from worker_core import hookspecs

    specs = sorted(name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "worker_spec"))
    assert specs == sorted([
        "after_task_publish", "before_task_publish", "broker_accepted", "broker_refused", "heartbeat_sent",
        "task_failed", "task_failure",
        "task_postrun", "task_prerun", "task_received", "task_rejected", "task_retried", "task_retry",
        "task_revoked", "task_started", "task_succeeded", "task_success", "worker_bootsteps",
        "worker_control_commands", "worker_init", "worker_options", "worker_process_init",
        "worker_gauges", "worker_process_shutdown", "worker_ready", "worker_shutdown",
        "worker_shutting_down", "worker_stopped", "worker_validate_options", "workerctl_commands",
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

"""A Celery app's configuration as this worker's settings, and the worker settings it cannot
honour (listed at start with what the worker does instead)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from worker_core import Settings
from worker_core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["HANDLED_BY_CELERY", "UNSUPPORTED", "broker_url", "configuration", "translate", "unsupported"]

#: Celery's default broker when its app names none (what ``celery worker`` connects to)
CELERY_DEFAULT_BROKER = "amqp://guest:guest@localhost:5672//"

#: Pools this worker has under Celery's names for them.
POOLS = {"prefork": "prefork", "processes": "prefork", "threads": "threads", "solo": "solo"}

#: Worker-side settings Celery's own machinery reads where the task runs (the tracer, the
#: result backend, the logging setup), so they behave as under ``celery worker``.
HANDLED_BY_CELERY = frozenset({
    "worker_deduplicate_successful_tasks", "worker_hijack_root_logger", "worker_log_format",
    "worker_task_log_format", "worker_log_datefmt",
    "worker_task_log_datefmt", "worker_redirect_stdouts", "worker_redirect_stdouts_level",
    "task_inherit_parent_priority", "task_store_errors_even_if_ignored", "task_remote_tracebacks",
    "task_annotations", "task_default_rate_limit", "result_chord_join_timeout",
    "result_chord_retry_interval", "result_chord_ordered", "task_allow_error_cb_on_chord_header",
})

#: Worker settings this worker does not honour, and what it does instead.
UNSUPPORTED: Mapping[str, str] = {
    "worker_direct": "no per-worker queue is consumed; name the queues with -Q",
    "worker_disable_prefetch": "the prefetch window is concurrency x worker_prefetch_multiplier",
    "worker_soft_shutdown_timeout": "a warm shutdown waits for the running tasks, a second signal "
                                    "stops them (cold)",
    "worker_enable_soft_shutdown_on_idle": "a warm shutdown waits for the running tasks, a second signal "
                                           "stops them (cold)",
    "worker_autoscaler": "autoscalers are plugins, chosen with --autoscaler",
    "worker_consumer": "the consumer is this worker's own",
    "worker_timer": "the timer is kombu's, this worker's own",
    "worker_timer_precision": "the timer is kombu's, this worker's own",
    "worker_proc_alive_timeout": "pool processes are waited for by the pool plugin",
    "worker_pool_putlocks": "the prefork pool writes to its children without a semaphore",
    "worker_pool_start_method": "the prefork pool forks its children",
    "worker_agent": "no actor agent is started",
    "worker_log_color": "log lines are not coloured",
}


def _seconds(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value


def broker_url(celery: Celery) -> str:
    """The broker the Celery app names (``;`` between failover URLs), else Celery's default."""
    url = celery.conf.broker_url
    if isinstance(url, (list, tuple)):
        url = ";".join(str(item) for item in url)
    return url or CELERY_DEFAULT_BROKER


def _changed(celery: Celery) -> dict[str, Any]:
    """Celery's settings whose value in the app's configuration is not Celery's default."""
    from celery.app.defaults import DEFAULTS

    conf = celery.conf
    return {name: conf[name] for name in DEFAULTS if name in conf and conf[name] != DEFAULTS[name]}


def translate(celery: Celery, spec: str) -> tuple[dict[str, Any], list[str]]:
    """This worker's settings for ``celery``'s configuration, and one line for each value it
    cannot take (a setting of the same name that this worker reads differently)."""
    changed = _changed(celery)
    known = set(Settings.names())
    settings: dict[str, Any] = {}
    notes: list[str] = []
    for name, value in changed.items():
        if name not in known or name in ("broker_url", "result_backend"):
            continue
        value = _seconds(value)
        if name == "worker_pool":
            pool = POOLS.get(value) if isinstance(value, str) else None
            if pool is None:
                notes.append(f"worker_pool={value!r}: not a pool here; the default pool runs instead "
                             f"(choose one with -P prefork|threads|solo)")
                continue
            value = pool
        elif name == "worker_prefetch_multiplier" and isinstance(value, int) and value < 1:
            notes.append(f"worker_prefetch_multiplier={value!r}: an unlimited prefetch is not offered; "
                         f"4 per process is used (set 1 or more)")
            continue
        elif name == "worker_concurrency" and not isinstance(value, int):
            notes.append(f"worker_concurrency={value!r}: one process per CPU is used (set a number)")
            continue
        elif name == "broker_failover_strategy" and not isinstance(value, str):
            notes.append("broker_failover_strategy: a function is not taken; round-robin is used "
                         "(or --failover round-robin|shuffle|priority)")
            continue
        elif name == "accept_content" and isinstance(value, (list, set, frozenset)):
            value = tuple(value)
        elif name == "broker_heartbeat" and value is None:
            value = 0  # Celery's "no heartbeats"
        try:
            Settings(**{name: value})
        except ConfigurationError as exc:
            notes.append(f"{name}={value!r}: not taken, the worker's default is used instead ({exc})")
            continue
        settings[name] = value
    settings["broker_url"] = broker_url(celery)
    settings["result_backend"] = f"celery://{spec}"
    return settings, notes


#: the prefixes of Celery's setting names: a key with one that Celery does not know is a typo
SETTING_PREFIXES = ("accept_", "beat_", "broker_", "cache_", "cassandra_", "control_", "database_",
                    "elasticsearch_", "event_", "mongodb_", "redis_", "result_", "riak_", "security_",
                    "task_", "worker_", "azureblockblob_", "s3_", "couchbase_", "arangodb_", "cosmosdbsql_",
                    "consul_", "gcs_", "filesystem_")


def unknown(celery: Celery) -> list[str]:
    """One line for each key of the app's configuration that reads as a setting but is none
    Celery or this worker knows, with the closest name: Celery ignores it silently, and so does
    the worker, but says so."""
    from celery.app.defaults import DEFAULTS

    from worker_core.options import did_you_mean

    known = {*DEFAULTS, *Settings.names()}
    table = celery.conf.table(with_defaults=False)
    lines = []
    for name in sorted(key for key in table if isinstance(key, str)):
        if name in known or not name.startswith(SETTING_PREFIXES):
            continue
        hint = did_you_mean(name, known).strip() or "Check its name in Celery's configuration reference."
        lines.append(f"{name}: no such setting, it is ignored (celery worker ignores it too). {hint}")
    return lines


def unsupported(celery: Celery) -> list[str]:
    """One line for each worker setting the app sets that this worker does not honour, and each
    unknown setting."""
    known = set(Settings.names())
    lines = unknown(celery)
    for name in sorted(_changed(celery)):
        if name in known or name in HANDLED_BY_CELERY:
            continue
        instead = UNSUPPORTED.get(name)
        if instead:
            lines.append(f"{name}: not supported; {instead}")
        elif instead is None and name.startswith(("worker_", "event_", "control_")):
            lines.append(f"{name}: not read by this worker")
    return lines


def configuration(celery: Celery, settings: Settings, with_defaults: bool) -> dict[str, Any]:
    """``inspect conf`` for the Celery app: its configuration as ``celery worker`` answers it
    (``conf.table()``, censored and made JSON-able by Celery's own functions), the worker's
    settings Celery has no name for, and the worker's value where it runs with another one than
    the app's configuration gives (a command-line option, a ``WORKER_*`` variable); the result
    backend stays the app's own."""
    from celery.utils.serialization import jsonify
    from kombu.utils.encoding import safe_repr

    from worker_core.redaction import redact_value

    table: dict[str, Any] = jsonify(
        celery.conf.table(with_defaults=with_defaults),
        keyfilter=lambda key: isinstance(key, str) and not key.startswith("__"),
        unknown_type_filter=safe_repr)
    translated, _notes = translate(celery, "")
    defaults = Settings()
    for name in Settings.names():
        if name in ("broker_url", "result_backend"):
            continue
        value = getattr(settings, name)
        if name in table:
            given = translated.get(name, getattr(defaults, name))
            if value == given or (isinstance(given, list) and tuple(given) == value):
                continue
        elif not with_defaults and value == getattr(defaults, name):
            continue
        table[name] = redact_value(name, _as_reply(value))
    if settings.broker_url != broker_url(celery):  # -b or WORKER_BROKER_URL
        table["broker_url"] = redact_value("broker_url", settings.broker_url)
    return table


def _as_reply(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_as_reply(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_reply(item) for key, item in value.items()}
    return value if value is None or isinstance(value, (str, int, float, bool, list)) else repr(value)

"""The app's settings: one attrs object with Celery's setting names, validated as it is built.

Sources, later wins: the defaults below, a config object (``app.config_from_object``), the
``App(...)`` arguments, ``WORKER_<NAME>`` environment variables (``WORKER_BROKER_URL``), then
changes made at run time with ``app.conf.update(...)`` (the command line's ``-b`` is one).

One module: every setting is a field of one attrs class, validated in one place.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import attrs

from ..exceptions import ConfigurationError
from ..options import did_you_mean, parse_brokers, scheme_of
from ..redaction import redact_url, redact_value
from .queues import check_queues
from .routes import check_routes

__all__ = ["ENV_PREFIX", "OWN_SETTINGS", "SERIALIZER_LIBRARIES", "Settings", "check_environment",
           "check_serializers", "result_accept", "settings_from"]

ENV_PREFIX = "WORKER_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _check(kind: type | tuple[type, ...], *, optional: bool = False, minimum: float | None = None) -> Any:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            ok = False
        else:
            ok = isinstance(value, kind)
        if not ok:
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            if optional:
                names += " or None"
            shown = redact_value(attribute.name, value)
            raise ConfigurationError(
                f"setting {attribute.name!r} must be {names} (got {shown!r} that is a {type(value).__name__})"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigurationError(
                f"setting {attribute.name!r} must be a finite number (got {value!r})"
                + ("; use None for no limit" if optional else "")
            )
        if minimum is not None and value < minimum:
            raise ConfigurationError(
                f"setting {attribute.name!r} must be at least {minimum:g} (got {value!r})"
            )

    return check


def _strings(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not value or not all(isinstance(item, str) and item for item in value):
        raise ConfigurationError(
            f"setting {attribute.name!r} must be a non-empty list of non-empty strings, for example "
            f"['json'] (got {value!r})"
        )


def _optional_strings(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _strings(_inst, attribute, value)


def _command_names(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (
        not isinstance(value, tuple) or not value or not all(isinstance(item, str) and item for item in value)
    ):
        raise ConfigurationError(
            f"setting {attribute.name!r} must be None (every command) or a non-empty list of command "
            f"names, for example ['ping', 'stats', 'inspect'] (got {value!r})"
        )


def _name(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, str) and (not value or value != value.strip()):
        raise ConfigurationError(
            f"setting {attribute.name!r} must be a name without surrounding spaces (got {value!r})"
        )


def _broker_urls(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        return
    urls = parse_brokers(value)
    schemes = sorted({scheme_of(url) for url in urls})
    if len(schemes) > 1:
        raise ConfigurationError(
            f"setting 'broker_url' mixes transports ({', '.join(schemes)}) in {redact_url(value)!r}: the "
            f"';'-separated URLs are failover servers of one kind, for example redis://a:6379/0;redis://b:6379/0"
        )


def _option_names(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    for name in value:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"setting {attribute.name!r} must map option names to values, for example "
                f"{{'liveness_file': '/tmp/alive'}} (got the key {name!r})"
            )


_QUEUE_TYPES = ("classic", "quorum")
_EXCHANGE_TYPES = ("direct", "topic", "fanout", "headers")


def _one_of(choices: tuple[str, ...], *, optional: bool = False) -> Any:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        if value not in choices:
            raise ConfigurationError(
                f"setting {attribute.name!r} must be one of {', '.join(choices)}"
                f"{' or None' if optional else ''} (got {value!r}).{did_you_mean(str(value), choices)}"
            )

    return check


def _zone(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        known = zoneinfo.available_timezones()
        raise ConfigurationError(
            f"setting {attribute.name!r} names no time zone this machine knows (got {value!r})."
            f"{did_you_mean(value, known)} Give an IANA name such as 'Europe/Berlin' or 'UTC' (install "
            f"tzdata if the machine has none)"
        ) from None


def _queues(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    check_queues(value)


def _routes(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    check_routes(value, resolve=False)


def _to_tuple(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(value)
    return value


def _to_dict(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


NUMBER = (int, float)


@attrs.frozen(kw_only=True)
class Settings:
    """Every setting the app and the worker read. Names follow Celery's."""

    # -- broker
    #: the broker: a URL whose scheme names the transport (``redis://``, ``amqp://``,
    #: ``embedded://``, ...), several separated by ``;`` for failover; None: ``embedded://``, a
    #: queue file in ``./.worker/``
    broker_url: str | None = attrs.field(default=None, validator=[_check(str, optional=True), _broker_urls])
    #: options handed to the transport, as kombu takes them (Redis: ``visibility_timeout``,
    #: ``global_keyprefix``, ...; a reconnect's ``interval_start``, ``interval_step``,
    #: ``interval_max``)
    broker_transport_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_to_dict,
                                                             validator=_check(dict))
    #: retry a lost broker connection (2 s, then 2 s more per attempt up to 30 s); off: a lost
    #: connection stops the worker
    broker_connection_retry: bool = attrs.field(default=True, validator=_check(bool))
    #: retry the first connection too; None: as ``broker_connection_retry``
    broker_connection_retry_on_startup: bool | None = attrs.field(default=None,
                                                                   validator=_check(bool, optional=True))
    #: attempts to connect before the worker gives up and stops; None: retry for ever
    broker_connection_max_retries: int | None = attrs.field(default=100,
                                                            validator=_check(int, optional=True, minimum=0))
    #: seconds to wait for the broker to accept a connection
    broker_connection_timeout: float = attrs.field(default=4.0, validator=_check(NUMBER, minimum=0))
    #: seconds between AMQP heartbeats (a missed one counts as a lost connection); 0 turns them off
    broker_heartbeat: float = attrs.field(default=120.0, validator=_check(NUMBER, minimum=0))
    #: how many times per heartbeat interval the worker checks the AMQP heartbeat
    broker_heartbeat_checkrate: float = attrs.field(default=3.0, validator=_check(NUMBER, minimum=0.1))
    #: how the worker picks the next of several broker URLs (``--failover``): round-robin, shuffle,
    #: priority, or a plugin's
    broker_failover_strategy: str = attrs.field(default="round-robin", validator=_check(str))
    #: TLS for the broker connection: True, or the transport's TLS arguments (Redis:
    #: ``ssl_cert_reqs``, ``ssl_ca_certs``, ...; AMQP: ``ca_certs``, ``cert_reqs``,
    #: ``server_hostname``, ...), as in Celery
    broker_use_ssl: bool | Mapping[str, Any] | None = attrs.field(
        default=None, converter=_to_dict, validator=_check((bool, dict), optional=True))
    #: seconds between checks whether a preferred broker answers again (failover "priority")
    broker_failback_interval: float = attrs.field(default=5.0, validator=_check(NUMBER, minimum=0.1))

    # -- results
    #: where results are stored: a URL whose scheme names the backend (``redis://``, ``rpc://``,
    #: ``embedded://``, ``disabled``); None: the one the transport offers (the embedded file for
    #: ``embedded://``), else none
    result_backend: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: seconds a stored result is kept; None or 0: for ever
    result_expires: float | None = attrs.field(default=86400.0,
                                               validator=_check(NUMBER, optional=True, minimum=0))
    #: store the task's name, args, kwargs, worker, retries and queue with each result, as Celery
    #: does
    result_extended: bool = attrs.field(default=False, validator=_check(bool))
    #: ``rpc://``: send results as persistent messages (delivery mode 2), which survive a broker
    #: restart; None or False: transient (delivery mode 1), as Celery sends them by default
    result_persistent: bool | None = attrs.field(default=None, validator=_check(bool, optional=True))
    #: seconds a chord's join state (its size, its header) is kept in the result backend; None:
    #: ``result_expires``
    result_chord_expires: float | None = attrs.field(default=None,
                                                     validator=_check(NUMBER, optional=True, minimum=0))
    #: seconds between two looks at a chord's header by ``celery.chord_unlock`` (result backends
    #: that do not count the header's results themselves)
    result_chord_retry_interval: float = attrs.field(default=1.0, validator=_check(NUMBER, minimum=0))
    #: seconds the worker completing a chord waits for the results of a header holding groups
    result_chord_join_timeout: float = attrs.field(default=3.0, validator=_check(NUMBER, minimum=0))
    #: the serializer results are stored in: json, msgpack, yaml, pickle, or one registered with
    #: kombu
    result_serializer: str = attrs.field(default="json", validator=[_check(str), _name])
    #: what stored results may be read in (serializer names or content types); None: accept_content
    result_accept_content: tuple[str, ...] | None = attrs.field(default=None, converter=_to_tuple,
                                                                validator=_optional_strings)
    #: options of the result backend's connection (Redis: ``global_keyprefix``, ``retry_policy``,
    #: ...), as in Celery
    result_backend_transport_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_to_dict,
                                                                     validator=_check(dict))
    #: TLS arguments for a Redis result backend (``ssl_cert_reqs``, ``ssl_ca_certs``, ...), as in Celery
    redis_backend_use_ssl: Mapping[str, Any] | None = attrs.field(default=None, converter=_to_dict,
                                                                  validator=_check(dict, optional=True))

    # -- tasks and messages
    #: the serializer tasks are sent in by this project's client (json, msgpack, yaml, pickle,
    #: ``auth`` to sign)
    task_serializer: str = attrs.field(default="json", validator=[_check(str), _name])
    #: the serializers or content types the worker accepts in messages; anything else is refused
    #: (pickle never by default)
    accept_content: tuple[str, ...] = attrs.field(default=("json",), converter=_to_tuple, validator=_strings)
    #: the queue tasks go to and the worker consumes when nothing else names one
    task_default_queue: str = attrs.field(default="celery", validator=[_check(str), _name])
    #: the priority of a task sent without one; None: no priority
    task_default_priority: int | None = attrs.field(default=None,
                                                    validator=_check(int, optional=True, minimum=0))
    #: ``x-max-priority`` of the classic RabbitMQ queues the worker declares; None: no priorities
    task_queue_max_priority: int | None = attrs.field(default=None,
                                                      validator=_check(int, optional=True, minimum=0))
    #: where each task's messages go (Celery's): a dict of task names, glob patterns and
    #: compiled regexes to a queue name or ``{"queue", "exchange", "exchange_type",
    #: "routing_key", "priority"}``, a router function, a dotted path to one, or a list of them
    task_routes: Any = attrs.field(default=None, validator=_routes)
    #: the queues (Celery's): kombu ``Queue`` objects, or objects such as ``{"name": "feed",
    #: "exchange": "feed", "exchange_type": "topic", "routing_key": "feed.#"}`` (see
    #: :data:`worker_core.app.queues.QUEUE_KEYS`); None: the default queue alone
    task_queues: Any = attrs.field(default=None, validator=_queues)
    #: the default queue's exchange (None: named after the queue) and its type
    task_default_exchange: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: the type of the default queue's exchange: direct, topic, fanout or headers
    task_default_exchange_type: str = attrs.field(default="direct", validator=_one_of(_EXCHANGE_TYPES))
    #: the default queue's routing key (None: its name)
    task_default_routing_key: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: the default queue's type when task_queues is None: "classic" or "quorum"
    task_default_queue_type: str = attrs.field(default="classic", validator=_one_of(_QUEUE_TYPES))
    #: a queue named nowhere (-Q, a route) is made as Celery makes it; off: it is an error
    task_create_missing_queues: bool = attrs.field(default=True, validator=_check(bool))
    #: the type (classic or quorum) of a queue made because it was named nowhere
    task_create_missing_queue_type: str = attrs.field(default="classic", validator=_one_of(_QUEUE_TYPES))
    #: the exchange type of a queue made because it was named nowhere; None: direct
    task_create_missing_queue_exchange_type: str | None = attrs.field(
        default=None, validator=_one_of(_EXCHANGE_TYPES, optional=True))
    #: acknowledge a task's message after the task ran, not as it starts, so a task whose worker
    #: dies runs again
    task_acks_late: bool = attrs.field(default=False, validator=_check(bool))
    #: with ``acks_late``, send a task whose process died back to the queue instead of failing it;
    #: None: off
    task_reject_on_worker_lost: bool | None = attrs.field(default=None, validator=_check(bool, optional=True))
    #: with ``acks_late``, acknowledge a task that failed or timed out; off: reject it (to the dead-
    #: letter queue)
    task_acks_on_failure_or_timeout: bool = attrs.field(default=True, validator=_check(bool))
    #: store no result for tasks that do not say otherwise
    task_ignore_result: bool = attrs.field(default=False, validator=_check(bool))
    #: store STARTED when a task starts
    task_track_started: bool = attrs.field(default=False, validator=_check(bool))
    #: ``chord.link_error(errback)`` links the errback to the header's tasks too, not only the body
    task_allow_error_cb_on_chord_header: bool = attrs.field(default=False, validator=_check(bool))
    #: the tasks a task sends when it finishes (callbacks, its chain's next step) get its priority
    task_inherit_parent_priority: bool = attrs.field(default=False, validator=_check(bool))
    #: seconds a task may run before its process is killed and the task fails with
    #: ``TimeLimitExceeded`` (prefork); None: no limit
    task_time_limit: float | None = attrs.field(default=None,
                                                validator=_check(NUMBER, optional=True, minimum=0))
    #: seconds after which ``SoftTimeLimitExceeded`` is raised inside the task; None: no limit
    task_soft_time_limit: float | None = attrs.field(default=None,
                                                    validator=_check(NUMBER, optional=True, minimum=0))
    #: seconds before a retried task runs again, for tasks that give no ``default_retry_delay``
    #: (Celery has this as a task attribute only)
    task_default_retry_delay: float = attrs.field(default=180.0, validator=_check(NUMBER, minimum=0))
    #: retry a publish that fails on a lost connection (the client's and a retrying task's)
    task_publish_retry: bool = attrs.field(default=True, validator=_check(bool))

    # -- worker
    #: processes or threads in the pool (``-c``); None: the number of CPUs (1 for solo)
    worker_concurrency: int | None = attrs.field(default=None,
                                                 validator=_check(int, optional=True, minimum=1))
    #: the pool by name (``-P``): prefork, threads, solo, or a plugin's; None: prefork, else
    #: threads, else solo, whichever is installed
    worker_pool: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: messages reserved per process or thread: the prefetch window is concurrency times this
    worker_prefetch_multiplier: int = attrs.field(default=4, validator=_check(int, minimum=1))
    #: replace a pool process after it ran this many tasks; None: never
    worker_max_tasks_per_child: int | None = attrs.field(default=None,
                                                         validator=_check(int, optional=True, minimum=1))
    #: replace a pool process whose resident memory passes this many KiB after a task; None: never
    worker_max_memory_per_child: int | None = attrs.field(default=None,
                                                          validator=_check(int, optional=True, minimum=1))
    #: after a lost connection, start again with a prefetch window reduced by the tasks still
    #: running and widen it as they finish
    worker_enable_prefetch_count_reduction: bool = attrs.field(default=True, validator=_check(bool))
    #: most messages the worker takes while tasks wait for their ETA or countdown, as Celery's: a
    #: held task widens the prefetch window by one up to this many messages in all, then no more
    #: are fetched until room frees; None: no limit
    worker_eta_task_limit: int | None = attrs.field(default=None,
                                                    validator=_check(int, optional=True, minimum=1))
    #: on RabbitMQ, stop running ``acks_late`` tasks when the connection is lost (their messages are
    #: delivered again) rather than run them twice
    worker_cancel_long_running_tasks_on_connection_loss: bool = attrs.field(default=False,
                                                                           validator=_check(bool))
    #: times a task whose process or whole worker died with it comes back before it fails for good
    #: as a poison message (every pool: see :mod:`worker_core.consumer.poison`); None lets it come
    #: back forever, as Celery does
    worker_redelivery_limit: int | None = attrs.field(default=5,
                                                      validator=_check(int, optional=True, minimum=1))
    #: consume quorum queues with a prefetch window per consumer (RabbitMQ has no global one
    #: for them) and hold their countdowns on the broker, as Celery does
    worker_detect_quorum_queues: bool = attrs.field(default=True, validator=_check(bool))
    #: the queue type of the broker-side delay queues (Celery's native delayed delivery)
    broker_native_delayed_delivery_queue_type: str = attrs.field(default="quorum",
                                                                 validator=_one_of(_QUEUE_TYPES))
    #: where messages the worker would discard go (undecodable, unknown task, refused content,
    #: over the redelivery limit, rejected by their task), with the reason in their headers;
    #: None discards them, as Celery does
    worker_dead_letter_queue: str | None = attrs.field(default="celery.dead_letter",
                                                       validator=[_check(str, optional=True), _name])
    #: accepted for Celery's configurations and not read: this worker fails a task whose process
    #: died as soon as the pool reports it
    worker_lost_wait: float = attrs.field(default=10.0, validator=_check(NUMBER, minimum=0))
    #: bytes a task's body may have; a larger message is rejected (to the dead-letter queue) before
    #: it is decoded
    worker_max_message_size: int = attrs.field(default=64 * 1024 * 1024, validator=_check(int, minimum=1))
    #: send task events (``-E``) from the start, for Flower and ``celery events``
    worker_send_task_events: bool = attrs.field(default=False, validator=_check(bool))
    #: file that keeps the revoked task ids across restarts (``--statedb``)
    worker_state_db: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: answer the remote ``pool_restart`` command (off by default, as in Celery)
    worker_pool_restarts: bool = attrs.field(default=False, validator=_check(bool))
    #: ignore every task's ``rate_limit``
    worker_disable_rate_limits: bool = attrs.field(default=False, validator=_check(bool))
    #: answer remote-control commands at all (off: no control queue, no replies), as in Celery
    worker_enable_remote_control: bool = attrs.field(default=True, validator=_check(bool))
    #: the remote-control commands this worker answers (names, or "inspect" for every read-only
    #: command and "control" for every command that changes the worker); None answers them all
    worker_remote_control_allow: tuple[str, ...] | None = attrs.field(
        default=None, converter=_to_tuple, validator=_command_names)
    #: values of the options plugins declare, by option name, as the command line takes them:
    #: ``{"liveness_file": "/tmp/alive"}``; the command line and ``WORKER_<OPTION_NAME>`` win
    worker_plugin_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_to_dict,
                                                          validator=[_check(dict), _option_names])

    # -- message signing (Celery's ``auth`` serializer)
    #: the PEM private key that signs messages sent with ``task_serializer='auth'``
    security_key: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: the password of ``security_key``, if it is encrypted
    security_key_password: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: the PEM certificate of ``security_key``, named in every signed message
    security_certificate: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: the trusted certificates (a directory, a file or a glob pattern) that signed messages are
    #: verified against
    security_cert_store: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: the digest signatures use (a name from ``cryptography.hazmat.primitives.hashes``)
    security_digest: str = attrs.field(default="sha256", validator=[_check(str), _name])

    # -- time, and periodic tasks (read by worker-beat: ``workerctl beat``, ``workerctl worker -B``)
    #: the time zone crontab schedules are read in (an IANA name such as ``Europe/Berlin``); None:
    #: UTC when ``enable_utc`` is on, else the machine's local zone, as in Celery
    timezone: str | None = attrs.field(default=None, validator=[_check(str, optional=True), _zone])
    #: with no ``timezone``, schedules are read in UTC; off: in the machine's local zone
    enable_utc: bool = attrs.field(default=True, validator=_check(bool))
    #: the periodic tasks, as Celery's: entry name to ``{"task", "schedule", "args", "kwargs",
    #: "options", "relative"}``, the schedule a number of seconds, a ``timedelta``, a ``crontab``
    #: or a ``solar`` (worker-beat checks each entry when the scheduler starts)
    beat_schedule: Mapping[str, Any] = attrs.field(factory=dict, converter=_to_dict, validator=_check(dict))
    #: where entries come from besides ``beat_schedule`` (``--scheduler``): ``store`` (entries
    #: added at run time with ``workerctl beat add``, kept on the broker) or ``settings``; None:
    #: ``store`` where the broker keeps records; Celery's default class is taken as None
    beat_scheduler: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: Celery's file of the scheduler's state (``-s``); this scheduler keeps its state on the
    #: broker, so a file given here is not used (a line says so)
    beat_schedule_filename: str | None = attrs.field(default=None, validator=_check(str, optional=True))
    #: the most seconds the scheduler waits before looking at the schedule again (entries added at
    #: run time are seen within it); 0: one second
    beat_max_loop_interval: float = attrs.field(default=0.0, validator=_check(NUMBER, minimum=0))
    #: seconds past which a missed crontab run is not sent late; None: the catch-up window decides
    #: (``beat_catch_up_window``), as in Celery
    beat_cron_starting_deadline: float | None = attrs.field(
        default=None, validator=_check(NUMBER, optional=True, minimum=0))
    #: seconds a scheduler holds the lease that lets it send without renewing it: the bound on a
    #: takeover after the sending scheduler dies (plus half a second; RabbitMQ: see its leases)
    beat_lease_timeout: float = attrs.field(default=3.0, validator=_check(NUMBER, minimum=1))
    #: seconds back a scheduler sends each run that was missed (a takeover, a restart); the runs
    #: missed before that are sent once, as Celery sends a run missed while it was down
    beat_catch_up_window: float = attrs.field(default=300.0, validator=_check(NUMBER, minimum=0))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in attrs.fields(cls))

    def update(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated."""
        check_names(changes)
        try:
            return attrs.evolve(self, **changes)
        except TypeError as exc:  # a converter choked on a value of the wrong kind
            raise ConfigurationError(f"bad setting value: {exc}") from None



#: The settings Celery does not have (every other one is Celery's, under the same name and with
#: Celery's meaning); the reference's Celery column reads this, and a test checks it against
#: Celery's own list.
OWN_SETTINGS = frozenset({
    "broker_failback_interval", "task_default_retry_delay", "worker_redelivery_limit",
    "worker_dead_letter_queue", "worker_max_message_size", "worker_remote_control_allow",
    "worker_plugin_options", "beat_lease_timeout", "beat_catch_up_window",
})

def check_names(names: Iterable[str]) -> None:
    known = Settings.names()
    for name in names:
        if name not in known:
            raise ConfigurationError(
                f"unknown setting {name!r}.{did_you_mean(name, known)} The settings are listed in "
                f"worker_core.app.settings.Settings"
            )


def _from_text(name: str, text: str) -> Any:
    """Convert an environment variable's text to the setting's type."""
    field = attrs.fields_dict(Settings)[name]
    kind = str(field.type)
    if kind == "Any":  # task_queues, task_routes: JSON, or a plain name (a router's dotted path)
        if text.strip() == "":
            return None
        if text.lstrip()[:1] in "[{":
            try:
                return json.loads(text)
            except ValueError as exc:
                raise ConfigurationError(
                    f"{ENV_PREFIX}{name.upper()} must be JSON (a list or an object) (got text that is not "
                    f"JSON: {exc})") from None
        return text
    if text.strip() == "" and "None" in kind:
        return None
    if "Mapping" in kind and (kind.startswith("Mapping") or text.lstrip().startswith("{")):
        # The text is not repeated in the error: an object of options may hold passwords.
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(
                f"{ENV_PREFIX}{name.upper()} must be a JSON object (got text that is not JSON: {exc})"
            ) from None
        if not isinstance(value, dict):
            raise ConfigurationError(
                f"{ENV_PREFIX}{name.upper()} must be a JSON object (got a JSON {type(value).__name__})"
            )
        return value
    if "bool" in kind and "int" not in kind:
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        also = " or a JSON object" if "Mapping" in kind else ""
        raise ConfigurationError(f"{ENV_PREFIX}{name.upper()} must be true or false{also} (got {text!r})")
    if kind.startswith("tuple"):
        return _to_tuple(text)
    if kind.startswith("int"):
        try:
            return int(text)
        except ValueError:
            raise ConfigurationError(
                f"{ENV_PREFIX}{name.upper()} must be a whole number (got {text!r})"
            ) from None
    if kind.startswith("float"):
        try:
            return float(text)
        except ValueError:
            raise ConfigurationError(f"{ENV_PREFIX}{name.upper()} must be a number (got {text!r})") from None
    return text


def from_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Settings given as ``WORKER_<NAME>`` environment variables."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for name in Settings.names():
        key = ENV_PREFIX + name.upper()
        if key in environ:
            found[name] = _from_text(name, environ[key])
    return found


def from_object(source: Any, namespace: str | None = None) -> dict[str, Any]:
    """Settings held by a mapping, module or object.

    Lowercase attribute names are setting names; with ``namespace="CELERY"``, uppercase names
    such as ``CELERY_BROKER_URL`` are read too (as Django projects write them).
    """
    items = source.items() if isinstance(source, Mapping) else (
        (name, getattr(source, name)) for name in dir(source) if not name.startswith("_")
    )
    found: dict[str, Any] = {}
    known = Settings.names()
    prefix = f"{namespace.upper()}_" if namespace else None
    for name, value in items:
        if prefix and name.startswith(prefix):
            key = name[len(prefix):].lower()
            check_names([key])
            found[key] = value
        elif name.islower() and (not callable(value) or name == "task_routes") \
                and not hasattr(value, "__file__"):  # a router function is a setting's value
            if name in known:
                found[name] = value
            elif isinstance(source, Mapping):
                check_names([name])
    return found


def settings_from(*sources: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                  overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from the defaults, each source in turn, the environment, then ``overrides``
    (changes made at run time with ``app.conf.update``, which win over everything)."""
    merged: dict[str, Any] = {}
    for source in sources:
        merged.update(source)
    merged.update(from_environment(environ))
    merged.update(overrides or {})
    check_names(merged)
    try:
        return Settings(**merged)
    except TypeError as exc:
        raise ConfigurationError(f"bad setting value: {exc}") from None


#: ``WORKER_*`` variables of the project that are not settings.
OTHER_VARIABLES = frozenset({"WORKER_DISABLE_PLUGINS"})


def check_environment(
    environ: Mapping[str, str] | None = None,
    plugin_options: Collection[str] | Callable[[], Collection[str]] = (),
) -> None:
    """Check every ``WORKER_<NAME>`` variable on its own, so an error names the variable: a value
    of the wrong kind, or a name that is not a setting but close to one (a typo that would
    otherwise be ignored silently). Unrelated ``WORKER_*`` variables are left alone.

    :param plugin_options: the names of the options plugins declare, whose variables
        (``WORKER_LIVENESS_FILE``) are theirs and no typo; a variable close to one of them is one.
        A function is asked for them only when a variable looks like a typo of a setting, so a
        command that does not load plugins loads them only then.
    """
    environ = os.environ if environ is None else environ
    known = Settings.names()
    options: Collection[str] | None = None if callable(plugin_options) else plugin_options
    for key, text in environ.items():
        if not key.startswith(ENV_PREFIX) or key in OTHER_VARIABLES:
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in known:
            if options is None and callable(plugin_options) and did_you_mean(name, known):
                options = plugin_options()
            declared = options or ()
            if name in declared:
                continue
            hint = did_you_mean(name, [*known, *declared])
            if hint:
                close = hint.split("'")[1]
                raise ConfigurationError(
                    f"{key} is not {'a setting or a plugin option' if declared else 'a setting'}. Did you "
                    f"mean {ENV_PREFIX}{close.upper()}? The settings are listed in "
                    f"worker_core.app.settings.Settings"
                    + (", the plugin options in workerctl worker --help" if declared else "")
                )
            continue
        try:
            Settings(**{name: _from_text(name, text)})
        except ConfigurationError as exc:
            message = str(exc)
            shown = redact_value(name, text)  # a URL's password or a secret setting's value
            raise ConfigurationError(message if key in message else f"{key}={shown!r}: {message}") from None


#: serializers kombu knows by name whose library is not part of Python: its module and pip package
SERIALIZER_LIBRARIES: Mapping[str, tuple[str, str]] = {"msgpack": ("msgpack", "msgpack"),
                                                        "yaml": ("yaml", "PyYAML")}
_PICKLE = frozenset({"pickle", "application/x-python-serialize"})


def result_accept(settings: Settings) -> tuple[str, ...]:
    """What stored results may be read in: ``result_accept_content``, else ``accept_content``
    (Celery's order)."""
    return settings.result_accept_content or settings.accept_content


def check_serializers(settings: Settings, task_serializers: Mapping[str, str | None] | None = None,
                      result_serializers: Mapping[str, str | None] | None = None) -> None:
    """Check that ``task_serializer``, ``result_serializer``, every ``accept_content`` and
    ``result_accept_content`` entry and each task's ``serializer`` and ``result_serializer``
    (``task_serializers``, ``result_serializers``: task name to serializer) name a serializer
    kombu knows whose library is installed, and that results are stored in pickle only when
    pickle is accepted for them. Call it once the app's module is imported, so serializers the
    module registers (``kombu.serialization.register``) count."""
    from kombu.serialization import registry

    known = sorted(registry.name_to_type)
    content_types = set(registry.type_to_name)
    for name in ("task_serializer", "result_serializer"):
        value = getattr(settings, name)
        if value not in registry.name_to_type:
            raise ConfigurationError(
                f"setting {name!r} names no serializer kombu knows (got {value!r})."
                f"{did_you_mean(value, known)} Known: {', '.join(known)}; register others with "
                f"kombu.serialization.register"
            )
        _check_library(f"setting {name!r}", value)
    for option, serializers in (("serializer", task_serializers), ("result_serializer", result_serializers)):
        for task, value in (serializers or {}).items():
            if value is None:
                continue
            if value not in registry.name_to_type:
                raise ConfigurationError(
                    f"@app.task for {task!r}: {option} {value!r} is not one kombu knows."
                    f"{did_you_mean(value, known)} Known: {', '.join(known)}"
                )
            _check_library(f"@app.task for {task!r}: {option}", value)
    for setting in ("accept_content", "result_accept_content"):
        for item in getattr(settings, setting) or ():
            if item not in registry.name_to_type and item not in content_types:
                raise ConfigurationError(
                    f"setting {setting!r} names no serializer or content type kombu knows (got {item!r})."
                    f"{did_you_mean(item, known)} Known: {', '.join(known)}"
                )
            _check_library(f"setting {setting!r}", registry.type_to_name.get(item, item))
    pickled = [f"@app.task for {task!r}: result_serializer"
               for task, value in (result_serializers or {}).items() if value == "pickle"]
    if settings.result_serializer == "pickle":
        pickled.insert(0, "setting 'result_serializer'")
    accepted = result_accept(settings)
    if pickled and not _PICKLE & set(accepted):
        raise ConfigurationError(
            f"{pickled[0]} is 'pickle', but pickle is not accepted for results (accepted: "
            f"{', '.join(accepted)}): results stored in pickle could not be read back, by this app or by "
            f"a Celery client. Add 'pickle' to result_accept_content (reading a pickled result runs the "
            f"code it holds: only with a result backend no one else can write to), or store results "
            f"as json"
        )


def _check_library(where: str, serializer: str) -> None:
    library = SERIALIZER_LIBRARIES.get(serializer)
    if library is None:
        return
    module, package = library
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigurationError(
            f"{where} names {serializer!r}, whose library is not installed: pip install {package}"
        ) from None

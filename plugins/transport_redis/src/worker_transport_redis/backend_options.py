"""The Redis result backend's URL, ``result_backend_transport_options`` and
``redis_backend_use_ssl``: checked once, and turned into a redis-py connection pool (plain, TLS,
or the master found through Sentinel)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.redaction import redact_url

from .tls import TLS, backend_tls, without_tls_query

__all__ = ["DEFAULT_REFUSED_RETRY_SECONDS", "BackendConfig", "check_backend"]

#: Celery's retry policy for result writes (``RedisBackend.retry_policy``).
DEFAULT_RETRY_POLICY: Mapping[str, float] = {"max_retries": 20, "interval_start": 0, "interval_step": 1,
                                             "interval_max": 1}
#: redis-py connection arguments taken from the options as they are.
_CONNECTION = ("socket_timeout", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
               "retry_on_timeout", "max_connections", "health_check_interval", "client_name", "username",
               "password")
_OWN = ("global_keyprefix", "master_name", "sentinel_kwargs", "min_other_sentinels", "retry_policy",
        "result_chord_ordered", "refused_retry_seconds")
#: how long (seconds) a write Redis refuses (out of memory, read-only, busy) is tried again
DEFAULT_REFUSED_RETRY_SECONDS = 60.0
#: Read by other Celery backends or brokers; accepted so a shared configuration keeps working.
_IGNORED = ("visibility_timeout",)
KNOWN = frozenset({*_CONNECTION, *_OWN, *_IGNORED})
_EXAMPLE = "redis://:password@127.0.0.1:6379/1"


class BackendConfig:
    """What the backend needs to connect: the pool factory's arguments, checked."""

    def __init__(self, url: str, options: Mapping[str, Any], tls: TLS | None = None) -> None:
        self.url = url
        self.scheme = url.partition("://")[0].lower()
        self.options = dict(options)
        self.tls = tls
        prefix = str(self.options.get("global_keyprefix") or "")
        # Celery separates the prefix from the key with "_" unless it already ends in a separator.
        if prefix and prefix[-1] not in ":_-.":
            prefix += "_"
        self.key_prefix = f"{prefix}celery-task-meta-"
        #: saved groups, and a chord's join state (its size: ``<group key>.s``)
        self.group_prefix = f"{prefix}celery-taskset-meta-"
        #: the worker's own counters (the poison cap's)
        self.counter_prefix = prefix
        policy = dict(DEFAULT_RETRY_POLICY)
        policy.update(self.options.get("retry_policy") or {})
        self.retry_policy = policy
        self.refused_retry_seconds = float(self.options.get("refused_retry_seconds",
                                                            DEFAULT_REFUSED_RETRY_SECONDS))
        self.connection = {name: self.options[name] for name in _CONNECTION if name in self.options}

    def pool(self) -> Any:
        """A new redis-py connection pool (imports redis-py)."""
        import redis

        tls = dict(self.tls.arguments) if self.tls is not None else {}
        if self.scheme != "sentinel":
            if not tls:
                return redis.ConnectionPool.from_url(self.url, **self.connection)
            # redis:// with redis_backend_use_ssl is TLS too, as in Celery
            return redis.ConnectionPool.from_url(without_tls_query(self.url), **self.connection, **tls,
                                                 connection_class=redis.SSLConnection)
        from redis.sentinel import Sentinel

        sentinels: list[tuple[str, int]] = []
        db, password, username = 0, None, None
        for part in self.url.split(";"):
            parsed = urlsplit(part.strip())
            sentinels.append((parsed.hostname or "127.0.0.1", parsed.port or 26379))
            if parsed.path.strip("/"):
                db = int(parsed.path.strip("/"))
            password = unquote(parsed.password) if parsed.password else password
            username = unquote(parsed.username) if parsed.username else username
        master: dict[str, Any] = {"db": db, **self.connection}
        if password is not None:
            master.setdefault("password", password)
        if username is not None:
            master.setdefault("username", username)
        sentinel = Sentinel(
            sentinels, min_other_sentinels=self.options.get("min_other_sentinels", 0),
                            sentinel_kwargs=self.options.get("sentinel_kwargs"), **self.connection)
        if tls:
            master.update(tls, ssl=True)  # the master's connections; the sentinels' are sentinel_kwargs
        client = sentinel.master_for(self.options["master_name"], **master)
        return client.connection_pool


def check_backend(url: str, options: Mapping[str, Any],
                  use_ssl: Mapping[str, Any] | None = None) -> BackendConfig:
    """Check a result backend URL, its options and its TLS arguments (``redis_backend_use_ssl``);
    bad ones raise ConfigurationError."""
    scheme = url.partition("://")[0].lower()
    if scheme not in ("redis", "rediss", "sentinel"):
        raise ConfigurationError(f"result backend URL {redact_url(url)!r} is not a Redis URL; for example "
                                 f"{_EXAMPLE}")
    for part in url.split(";"):
        try:
            parsed = urlsplit(part.strip())
            parsed.port  # noqa: B018 (raises ValueError for a bad port)
        except ValueError as exc:
            raise ConfigurationError(f"result backend URL {redact_url(part)!r} is malformed ({exc}); "
                                     f"for example {_EXAMPLE}") from None
        path = parsed.path.strip("/")
        if path and not path.isdigit():
            raise ConfigurationError(
                f"result backend URL {redact_url(part)!r} names database {path!r}: the path must be the "
                f"database number; for example {_EXAMPLE}"
            )
    for name in options:
        if name not in KNOWN:
            raise ConfigurationError(
                f"unknown result_backend_transport_options entry {name!r} for the Redis result backend."
                f"{did_you_mean(name, KNOWN)} It reads {', '.join(sorted(KNOWN))}"
            )
    prefix = options.get("global_keyprefix")
    if prefix is not None and not isinstance(prefix, str):
        raise ConfigurationError(f"result_backend_transport_options['global_keyprefix'] must be a string "
                                 f"(got {prefix!r} that is a {type(prefix).__name__}); for example 'myapp:'")
    policy = options.get("retry_policy")
    if policy is not None and (
        not isinstance(policy, Mapping) or not set(policy) <= set(DEFAULT_RETRY_POLICY)
    ):
        raise ConfigurationError(
            f"result_backend_transport_options['retry_policy'] must be a mapping with keys among "
            f"{', '.join(DEFAULT_RETRY_POLICY)} (got {policy!r}); for example {dict(DEFAULT_RETRY_POLICY)!r}"
        )
    refused = options.get("refused_retry_seconds")
    number = isinstance(refused, (int, float)) and not isinstance(refused, bool)
    if refused is not None and not (number and refused >= 0):
        raise ConfigurationError(
            f"result_backend_transport_options['refused_retry_seconds'] must be a number of seconds, 0 or "
            f"more (got {refused!r}); for example {DEFAULT_REFUSED_RETRY_SECONDS:g}")
    if scheme == "sentinel" and not options.get("master_name"):
        raise ConfigurationError(
            "a sentinel:// result backend needs the master's name: set result_backend_transport_options="
            "{'master_name': 'mymaster'}"
        )
    return BackendConfig(url, options, backend_tls(url, scheme, use_ssl))

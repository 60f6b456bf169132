"""Connecting to the broker: retries on the schedule of seed 003 and failover between URLs.

Intervals start at ``interval_start`` (2 s) and grow by ``interval_step`` (2 s) up to
``interval_max`` (30 s), read from ``broker_transport_options`` as kombu does. With several URLs
every URL is tried in turn before waiting ("Will retry using next failover.").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..app.broker import connection_for, connection_through, transport_for
from ..app.settings import Settings
from ..exceptions import ConfigurationError, ConnectionLostError
from ..plugins.manager import PluginManager
from ..redaction import redact_url
from ..slots import ConnectFailure, ExplainsConnectFailures

if TYPE_CHECKING:
    from kombu.connection import Connection

    from ..slots import Transport

__all__ = ["Connector", "retry_intervals"]

logger = logging.getLogger("worker.consumer")


def explained(transport: object, exc: BaseException) -> ConnectFailure:
    """Why a connection attempt failed, in one line: the transport's words for it
    (:class:`~worker_core.slots.ExplainsConnectFailures`), else the error's own, a TLS handshake
    named as such; retried unless the transport says trying again cannot help."""
    import ssl

    if isinstance(transport, ExplainsConnectFailures):
        failure = transport.explain_connect_failure(exc)
        if failure is not None:
            return failure
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ssl.SSLError):
        return ConnectFailure(f"the TLS handshake failed ({text}); check the broker's TLS port and "
                              "certificates (broker_use_ssl)")
    return ConnectFailure(text.rstrip("."))


def retry_intervals(start: float, step: float, maximum: float) -> Iterator[float]:
    interval = start
    while True:
        yield min(interval, maximum)
        interval += step


def _number(options: dict[str, Any], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigurationError(
            f"broker_transport_options[{key!r}] must be a number of seconds, 0 or more (got {value!r})"
        )
    return float(value)


class Connector:
    """Opens broker connections for the consumer, retrying and failing over."""

    def __init__(self, plugins: PluginManager, settings: Settings, urls: tuple[str, ...], failover: str,
                 should_continue: Callable[[], bool],
                 connection_options: dict[str, Any] | None = None) -> None:
        self.plugins = plugins
        self.settings = settings
        self.urls = urls
        self.strategy = plugins.slot("failover", failover)(list(urls))
        self.should_continue = should_continue
        self.connection_options = dict(connection_options or {})
        options = dict(settings.broker_transport_options)
        self.interval_start = _number(options, "interval_start", 2.0)
        self.interval_step = _number(options, "interval_step", 2.0)
        self.interval_max = _number(options, "interval_max", 30.0)
        self.current: str | None = None
        #: the transport plugin object the last connection was made with
        self.transport: Transport | None = None
        self.connected_once = False

    def connect(self, on_wait: Callable[[], None] | None = None,
                before: Callable[[Connection, str], None] | None = None) -> Connection:
        """Return a connected kombu connection, or raise :class:`ConnectionLostError`; ``before``
        is called with each connection made, and its URL, before it connects."""
        settings = self.settings
        retry = settings.broker_connection_retry
        if not self.connected_once and settings.broker_connection_retry_on_startup is not None:
            retry = settings.broker_connection_retry_on_startup
        max_retries = settings.broker_connection_max_retries
        url = self.current or self.strategy.first()
        intervals = retry_intervals(self.interval_start, self.interval_step, self.interval_max)
        retries = 0
        tried_in_cycle = 0
        while True:
            transport = transport_for(self.plugins, url, settings)
            connection = connection_through(transport, url, settings, **self.connection_options)
            # a broker may refuse the connection with what its library counts as a channel error
            # (py-amqp's ACCESS_REFUSED for a login)
            failures = (*connection.recoverable_connection_errors, *connection.connection_errors,
                        *connection.channel_errors, OSError)
            try:
                if before is not None:
                    before(connection, url)
                connection.connect()
            except failures as exc:
                connection.release()
                failure = explained(transport, exc)
                if not failure.retry:
                    raise ConnectionLostError(
                        f"cannot connect to {redact_url(url)}: {failure.reason}") from exc
                if not retry:
                    raise ConnectionLostError(
                        f"cannot connect to {redact_url(url)}: {failure.reason}; retrying is off "
                        f"(broker_connection_retry{'_on_startup' if not self.connected_once else ''}=False)"
                    ) from exc
                if max_retries is not None and retries >= max_retries:
                    raise ConnectionLostError(
                        f"cannot connect to {redact_url(url)}: {failure.reason}; gave up after {retries} "
                        f"retries (broker_connection_max_retries={max_retries})"
                    ) from exc
                tried_in_cycle += 1
                next_url = self.strategy.next(url)
                if len(self.urls) > 1 and tried_in_cycle < len(self.urls):
                    logger.error("consumer: Cannot connect to %s: %s. Will retry using next failover.",
                                 redact_url(url), failure.reason)
                    logger.warning("consumer: switching broker from %s to %s", redact_url(url),
                                   redact_url(next_url))
                    url = next_url
                    continue
                tried_in_cycle = 0
                wait = next(intervals)
                retries += 1
                limit = "inf" if max_retries is None else max_retries
                logger.error("consumer: Cannot connect to %s: %s. Trying again in %.2f seconds... (%d/%s)",
                             redact_url(url), failure.reason, wait, retries, limit)
                if next_url != url:
                    logger.warning("consumer: switching broker from %s to %s", redact_url(url),
                                   redact_url(next_url))
                url = next_url
                if not self._sleep(wait, on_wait):
                    raise ConnectionLostError("stopped while waiting to reconnect to the broker") from exc
                continue
            self.current = url
            self.transport = transport
            if self.connected_once:
                logger.info("Connected to %s", redact_url(url))
            self.connected_once = True
            return connection

    def answers(self, url: str, timeout: float = 1.0) -> bool:
        """Whether ``url`` accepts a connection right now (a short probe, then closed)."""
        connection = connection_for(self.plugins, url, self.settings, connect_timeout=timeout)
        try:
            connection.connect()
            return True
        except Exception:
            return False
        finally:
            try:
                connection.release()
            except Exception:
                pass

    def _sleep(self, seconds: float, on_wait: Callable[[], None] | None) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not self.should_continue():
                return False
            if on_wait is not None:
                on_wait()
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        return self.should_continue()

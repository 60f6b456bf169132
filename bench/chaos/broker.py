"""The broker side of a soak: a private redis-server or a unique queue on the shared RabbitMQ, a TCP
proxy the worker connects through (so the connection can be cut), publishing and clean-up."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import attrs
from faults import RedisServer, TcpProxy  # tests/faults.py (the soak puts tests/ on sys.path)

from worker_core import App
from worker_core.app.broker import connection_for, task_queue

__all__ = ["TASK_NAME", "Plan", "SoakBroker", "open_broker"]

TASK_NAME = "soak.record"
AMQP_PORT = 5672
#: The worker reconnects quickly, so a cut costs about its own length (the default waits 2 s, 4 s, ...).
RECONNECT = {"interval_start": 0.2, "interval_step": 0.2, "interval_max": 1.0}


@attrs.frozen
class Plan:
    """Which tasks are long (run ``long_seconds``) and which wait for a countdown, by number."""

    long: frozenset[int] = frozenset()
    long_seconds: float = 0.0
    countdowns: dict[int, float] = attrs.Factory(dict)


@attrs.define
class SoakBroker:
    """Where the soak's messages live and how each side reaches them."""

    kind: str
    #: for the publisher and the final checks: straight to the broker
    direct_url: str
    #: for the worker: through :attr:`proxy`
    proxied_url: str
    ledger_url: str
    queue: str
    transport_options: dict[str, Any]
    proxy: TcpProxy
    redis: RedisServer
    _app: App | None = None

    @property
    def app(self) -> App:
        if self._app is None:
            self._app = App("soak-driver", broker=self.direct_url, result_backend="disabled",
                            task_ignore_result=True, broker_transport_options=self.transport_options)
        return self._app

    def publish(self, count: int, plan: Plan | None = None) -> None:
        """Send ``count`` tasks with ids ``t0`` ... ``t<count-1>``, long ones and countdowns as
        ``plan`` says."""
        plan = plan or Plan()
        send = self.app.send_task
        for number in range(count):
            args = (plan.long_seconds,) if number in plan.long else ()
            send(TASK_NAME, args, queue=self.queue, task_id=f"t{number}",
                 countdown=plan.countdowns.get(number))

    def waiting(self) -> int:
        """Messages still in the queue, plus (Redis) those delivered but not acknowledged."""
        with connection_for(self.app.plugins, self.direct_url, self.app.settings) as connection:
            if self.kind == "redis":
                client = connection.default_channel.client
                return int(client.llen(self.queue)) + int(client.hlen("unacked"))
            queue = task_queue(self.queue, self.app.settings)(connection.default_channel)
            return int(queue.queue_declare(passive=True).message_count)

    def leftovers(self) -> list[str]:
        """The task ids of the messages still in the broker (taken out of RabbitMQ's queue)."""
        ids: list[str] = []
        with connection_for(self.app.plugins, self.direct_url, self.app.settings) as connection:
            channel = connection.default_channel
            if self.kind == "redis":
                client = channel.client
                envelopes = [*client.lrange(self.queue, 0, -1), *client.hvals("unacked")]
                for raw in envelopes:
                    envelope = json.loads(raw)
                    if isinstance(envelope, list):  # unacked: [message, exchange, routing key]
                        envelope = envelope[0]
                    ids.append(str(envelope.get("headers", {}).get("id")))
                return ids
            while (message := channel.basic_get(self.queue, no_ack=True)) is not None:
                ids.append(str(message.headers.get("id")))
        return ids

    def close(self) -> None:
        """Delete the queue (RabbitMQ) and stop the private servers and the proxy."""
        try:
            if self.kind == "amqp":
                with connection_for(self.app.plugins, self.direct_url, self.app.settings) as connection:
                    queue = task_queue(self.queue, self.app.settings)(connection.default_channel)
                    queue.delete()
                    queue.exchange.delete()
        finally:
            if self._app is not None:
                self._app.close()
            self.proxy.close()
            self.redis.stop()


def open_broker(kind: str, workdir: Path, amqp_url: str, visibility_timeout: float = 20.0) -> SoakBroker:
    """Start a private redis-server (the Redis broker and, in database 1, the ledger) and a proxy in
    front of the broker; for ``amqp`` the broker is the shared RabbitMQ with a queue of our own."""
    redis = RedisServer(workdir).start()
    ledger_url = f"redis://127.0.0.1:{redis.port}/1"
    queue = f"soak-{uuid.uuid4().hex[:8]}"
    if kind == "redis":
        proxy = TcpProxy("127.0.0.1", redis.port)
        options: dict[str, Any] = {"visibility_timeout": visibility_timeout, **RECONNECT}
        direct, proxied = redis.url, f"redis://127.0.0.1:{proxy.port}/0"
    elif kind == "amqp":
        proxy = TcpProxy("127.0.0.1", AMQP_PORT)
        options = dict(RECONNECT)
        direct = amqp_url
        proxied = amqp_url.replace(f":{AMQP_PORT}/", f":{proxy.port}/")
    else:
        redis.stop()
        raise ValueError(f"broker must be redis or amqp (got {kind!r})")
    return SoakBroker(kind, direct, proxied, ledger_url, queue, options, proxy, redis)

"""The AMQP transport (being written)."""

from __future__ import annotations

from typing import Any, ClassVar

from worker_core.exceptions import NotImplementedYet


class AmqpTransport:
    """Reaches RabbitMQ through py-amqp."""

    supports_async: ClassVar[bool] = True

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        return None

    def __init__(self, url: str, settings: Any) -> None:
        raise NotImplementedYet("the AMQP transport (worker-transport-amqp) is not implemented yet")

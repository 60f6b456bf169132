"""RabbitMQ (AMQP 0.9.1) broker for worker."""

from .transport import AmqpTransport

__all__ = ["AmqpTransport"]

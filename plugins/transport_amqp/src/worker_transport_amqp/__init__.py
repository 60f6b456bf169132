"""RabbitMQ (AMQP 0.9.1) broker for worker."""

__all__: list[str] = []

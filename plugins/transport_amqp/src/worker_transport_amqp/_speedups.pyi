"""The C version of :func:`worker_transport_amqp.delivery.next_delivery_python`."""

from .delivery import Delivery

def next_delivery(buffer: bytes, /) -> Delivery | None: ...

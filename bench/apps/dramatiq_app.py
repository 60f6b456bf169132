"""The benchmark tasks for Dramatiq (RabbitMQ only; broker from BENCH_BROKER)."""

import os

import dramatiq
import sink
from dramatiq.brokers.rabbitmq import RabbitmqBroker

#: Dramatiq declares its queues with dead-letter arguments, so it gets a queue of its own.
QUEUE = "bench_dramatiq"

_url = os.environ["BENCH_BROKER"]
if _url.endswith("//"):  # kombu writes the default vhost as "//"; pika wants it quoted
    _url = _url[:-1] + "%2F"
broker = RabbitmqBroker(url=_url)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop():
    sink.noop()


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def latency(sent_at):
    sink.latency(sent_at)

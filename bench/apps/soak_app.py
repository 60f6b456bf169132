"""The soak's task: every execution appends one line to a Redis list (``SOAK_LEDGER_URL``) as it
starts, naming the task, the process, the worker generation, whether the broker redelivered the
message and when, by the ledger's clock (the worker's own may be stepped); a long task then sleeps
for ``seconds``."""

from __future__ import annotations

import faulthandler
import os
import signal
import time

import redis

from worker_core import App

app = App("soak", task_acks_late=True, task_reject_on_worker_lost=True, task_ignore_result=True,
          worker_redelivery_limit=None)

LEDGER_KEY = "soak:runs"  # chaos.ledger.LEDGER_KEY
# The soak sends SIGUSR1 to a worker that does not stop, to see where it is stuck.
faulthandler.register(signal.SIGUSR1, all_threads=True)
_client: redis.Redis | None = None
_pid = 0
#: appends ARGV[1] and the server's time (seconds, to the microsecond) to KEYS[1]
_APPEND = ("local t = redis.call('TIME') "
           "redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. string.format('%d.%06d', t[1], t[2]))")


def _ledger() -> redis.Redis:
    global _client, _pid
    if _client is None or _pid != os.getpid():  # one connection per process, also after fork
        _client = redis.Redis.from_url(os.environ["SOAK_LEDGER_URL"])
        _pid = os.getpid()
    return _client


@app.task(name="soak.record", bind=True, ignore_result=True)
def record(self, seconds: float = 0.0) -> None:
    redelivered = int(bool((self.request.delivery_info or {}).get("redelivered")))
    generation = os.environ.get("SOAK_GENERATION", "0")
    line = f"{self.request.id} {os.getpid()} {generation} {redelivered}"
    _ledger().eval(_APPEND, 1, LEDGER_KEY, line)
    if seconds:
        time.sleep(seconds)

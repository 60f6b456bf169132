"""Tasks for the routing tests: one that retries twice with a countdown the broker holds (the
second time from a message that came out of the delay levels)."""

from __future__ import annotations

from worker_core import App

app = App("routed")


@app.task(name="routed.again", bind=True, max_retries=2, default_retry_delay=1)
def again(self):
    if self.request.retries < 2:
        raise self.retry()
    info = self.request.delivery_info or {}
    return [self.request.retries, info.get("exchange"), info.get("routing_key")]

"""The app of the scheduler tests: a 1 s entry whose ticks go to the queue ``beat-ticks`` (read by
the test itself, which records when each tick arrived), and a task that records its runs."""

import os

from worker_core import App

app = App("beat_fleet", broker=os.environ.get("BEAT_BROKER"), result_backend="disabled")
app.conf.update(
    beat_schedule={"tick": {"task": "beat_fleet.tick", "schedule": 1.0, "args": ("every second",),
                            "options": {"queue": "beat-ticks", "expires": 600}}},
    worker_prefetch_multiplier=1,
)


@app.task(name="beat_fleet.tick")
def tick(what: str) -> str:
    return what

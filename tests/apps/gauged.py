"""apps.basic's tasks, with gauges of the app's own (the ``worker_gauges`` hook, as a scheduler
plugin reports its figures): served with the worker's metrics."""

from __future__ import annotations

from apps.basic import app
from worker_core.hookspecs import Gauge


@app.hook
def worker_gauges(worker):
    return [Gauge("worker_beat_leader", "1 while this worker sends the periodic tasks.", 1.0),
            Gauge("worker_beat_entry_due", "Seconds to an entry's next run.", 30.0, {"entry": "nightly"})]

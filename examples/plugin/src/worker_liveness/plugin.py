"""Hook implementations: the --liveness-file option, the Liveness step, and the ``liveness``
remote-control command (``workerctl inspect liveness [MAX_AGE]``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from worker_core import Condition, ControlCommand, OptionSpec, Step, WorkerOptions, hookimpl


def _positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"must be greater than 0 (got {text!r})")
    return value


class Liveness(Step[Any]):
    """Touches a file every few seconds from the worker's event loop, so a Kubernetes
    ``livenessProbe`` can check the file's age instead of sending a remote-control ping.
    A stuck event loop stops touching it, which is exactly what the probe should catch."""

    name = "Liveness"
    requires = ("Timer",)
    condition = Condition("--liveness-file is given", lambda o: o.extra.get("liveness_file") is not None)

    def describe(self, options: WorkerOptions) -> str:
        return f"touch {options.extra['liveness_file']} every {options.extra['liveness_interval']:g}s"

    def start(self, worker: Any) -> None:
        path = Path(worker.options.extra["liveness_file"])
        interval = worker.options.extra["liveness_interval"]

        def touch() -> None:
            path.touch()
            os.utime(path)

        touch()
        self.entry = worker.timer.call_repeatedly(interval, touch)

    def stop(self, worker: Any) -> None:
        self.entry.cancel()
        Path(worker.options.extra["liveness_file"]).unlink(missing_ok=True)


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec("liveness_file", ("--liveness-file",), help="Touch this file while the worker runs."),
        OptionSpec("liveness_interval", ("--liveness-interval",), convert=_positive_seconds, default=5.0,
                   help="Seconds between touches (default 5)."),
    ]


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    return [Liveness()] if blueprint == "worker" else []


def liveness(worker: Any, max_age: float | None = None, **_extra: Any) -> dict[str, Any]:
    """How long ago the file was touched; with ``max_age``, whether that is too long ago."""
    name = worker.options.extra.get("liveness_file")
    if name is None:
        return {"error": "this worker was started without --liveness-file"}
    try:
        age = round(time.time() - Path(name).stat().st_mtime, 3)
    except OSError as exc:
        return {"error": f"cannot read {name}: {exc.strerror}"}
    reply: dict[str, Any] = {"file": name, "age": age}
    if max_age is not None:
        reply["stale"] = age > float(max_age)
    return reply


@hookimpl
def worker_control_commands() -> list[ControlCommand]:
    return [ControlCommand("liveness", liveness, kind="inspect", args=(("max_age", float),),
                           help="Seconds since the liveness file was touched (stale past MAX_AGE).")]

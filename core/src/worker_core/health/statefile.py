"""The health state file (``--health-file``): what the worker writes for exec probes, and what
``workerctl health`` reads. Only the standard library: the probe imports this and little else.

The file holds one JSON object, replaced whole (written beside it, then renamed), about once a
second and at once when readiness changes::

    {"version": 1, "pid": 4242, "hostname": "w1@pod", "written": 81234.5, "progress": 81234.2,
     "liveness_timeout": 60.0, "started": true, "ready": false,
     "reason": "broker-disconnected", "reason_since": 81230.1}

Times are the system's monotonic clock (``time.monotonic()``, shared by every process of the
machine and never stepped by NTP or an operator), so the probe compares them with its own.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["VERSION", "read", "remove", "write"]

VERSION = 1


def write(path: str, state: dict[str, Any]) -> None:
    """Replace the file at ``path`` with ``state`` in one rename: a reader sees the old state or
    the new one, never half of one."""
    scratch = f"{path}.{os.getpid()}.tmp"
    with open(scratch, "w", encoding="utf-8") as file:
        json.dump({"version": VERSION, **state}, file, separators=(",", ":"))
    os.replace(scratch, path)


def read(path: str) -> dict[str, Any]:
    """The state in the file at ``path``.

    :raise FileNotFoundError: no worker wrote it (not started yet, or stopped and removed it).
    :raise ValueError: it is not a state file of this version.
    """
    with open(path, encoding="utf-8") as file:
        text = file.read()
    try:
        state = json.loads(text)
    except ValueError:
        raise ValueError(f"{path} is not a worker health file (not JSON)") from None
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise ValueError(f"{path} is not a worker health file of version {VERSION}")
    return state


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

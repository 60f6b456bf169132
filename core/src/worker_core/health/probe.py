"""``workerctl health live|ready|started``: the exec probe. It reads the worker's state file and
answers from it, importing neither the app nor its tasks, nor the command-line library: only the
standard library and :mod:`.statefile`, so it answers in a few tens of milliseconds.

Exit status 0 when the check passes, 1 when it does not (with the reason on standard output), 2
for a usage error.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import statefile

__all__ = ["CHECKS", "STALE_AFTER", "evaluate", "main"]

CHECKS = ("live", "ready", "started")
#: seconds after which a state file that was not rewritten says nothing of readiness (the
#: worker rewrites it every second)
STALE_AFTER = 10.0
FILE_VARIABLE = "WORKER_HEALTH_FILE"

USAGE = f"""\
Usage: workerctl health live|ready|started [--file PATH]

  Answer a probe from the state file the worker writes with --health-file (or the variable
  {FILE_VARIABLE}, which this command reads too): exit 0 if the check passes, 1 if not.

  live     the worker's main loop makes progress (a broker outage does not stop it)
  ready    it takes and runs tasks (else the reason: starting, draining, broker-disconnected,
           broker-blocked, consumer-stalled)
  started  it loaded its app and started its pool and consumer
"""


def evaluate(check: str, state: dict[str, Any], now: float, pid_alive: bool = True) -> tuple[bool, str]:
    """Whether ``check`` passes for ``state`` read at ``now`` (monotonic), and the line to print."""
    written = float(state.get("written", 0.0))
    timeout = float(state.get("liveness_timeout", 60.0))
    age = now - written
    if not pid_alive:
        return False, f"gone: the worker (pid {state.get('pid')}) is not running"
    if check == "live":
        if age > timeout:
            return False, f"stuck: the worker has not written its state for {age:.0f}s"
        if not state.get("started"):
            return True, "booting"
        progress_age = now - float(state.get("progress", 0.0))
        if progress_age > timeout:
            return False, f"stuck: the main loop made no progress for {progress_age:.0f}s"
        return True, "live"
    if check == "started":
        if not state.get("started"):
            return False, "booting"
        if age > timeout:
            return False, f"stuck: the worker has not written its state for {age:.0f}s"
        return True, "started"
    # ready
    if age > STALE_AFTER:
        return False, f"unknown: the worker has not written its state for {age:.0f}s"
    reason = str(state.get("reason", "unknown"))
    if state.get("ready"):
        return True, reason
    held = now - float(state.get("reason_since", now))
    return False, f"{reason} for {held:.0f}s" if held >= 1 else reason


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process of that number: not ours to judge
        return True
    return True


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    check, rest = args[0], args[1:]
    path = os.environ.get(FILE_VARIABLE) or None
    while rest:
        option = rest.pop(0)
        if option in ("-f", "--file") and rest:
            path = rest.pop(0)
        elif option.startswith("--file="):
            path = option.partition("=")[2]
        else:
            print(f"workerctl health: unknown argument {option!r}\n\n{USAGE}", end="", file=sys.stderr)
            return 2
    if check not in CHECKS:
        print(f"workerctl health: the check must be one of {', '.join(CHECKS)} (got {check!r})",
              file=sys.stderr)
        return 2
    if not path:
        print(f"workerctl health: name the worker's state file with --file PATH or {FILE_VARIABLE} "
              f"(the worker writes it with --health-file PATH)", file=sys.stderr)
        return 2
    try:
        state = statefile.read(path)
    except FileNotFoundError:
        print(f"not {check}: no state file at {path} (the worker has not started, or has stopped)")
        return 1
    except (OSError, ValueError) as exc:
        print(f"not {check}: cannot read {path}: {exc}")
        return 1
    ok, line = evaluate(check, state, time.monotonic(), _pid_alive(state.get("pid")))
    print(f"{check}: {line}" if ok else f"not {check}: {line}")
    return 0 if ok else 1

"""Signals as a remote-control request names them (``revoke(terminate=True, signal="KILL")``)."""

from __future__ import annotations

import signal as signals
from typing import Any

__all__ = ["signal_number"]


def signal_number(value: Any) -> int:
    """A signal given by number or by name, with or without ``SIG`` (``KILL``, ``SIGKILL``, 9)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    elif isinstance(value, str):
        name = value.strip().upper()
        found = getattr(signals, name if name.startswith("SIG") else f"SIG{name}", None)
        if not isinstance(found, int) or "_" in name:
            raise ValueError(f"unknown signal {value!r}: give a name such as TERM, KILL or USR1, or a number")
        number = found
    else:
        raise ValueError(f"a signal is a name or a number (got {value!r})")
    if number not in signals.valid_signals():
        raise ValueError(f"no signal has the number {number}")
    return int(number)

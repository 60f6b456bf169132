"""The state ``--statedb`` keeps across restarts, as Celery's worker keeps it: the revoked task
ids (each with when it was revoked) and the logical clock, in one JSON file replaced in one
step. The next start adds the ids that have not expired and moves its clock past the one kept.
"""

from __future__ import annotations

import dbm
import json
import os
from collections.abc import Mapping

import attrs

__all__ = ["State", "read_state", "write_state"]


@attrs.frozen
class State:
    """What a state file holds: revoked ids with the wall-clock time each was revoked, and the
    logical clock's value (0 in a file written without one)."""

    revoked: Mapping[str, float] = attrs.field(factory=dict)
    clock: int = 0


def read_state(path: str) -> State:
    """The state in ``path``; an empty one when there is no file. ``ValueError`` naming the file
    when it is not one this worker wrote."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except FileNotFoundError:
        return State()
    except (OSError, ValueError) as exc:
        kind = _dbm_kind(path)
        if kind:
            raise ValueError(
                f"the state file {path!r} is a {kind} database, as Celery's worker writes it; this worker "
                "keeps its state as JSON") from None
        raise ValueError(f"cannot read the state file {path!r}: {exc}") from None
    revoked = data.get("revoked") if isinstance(data, dict) else None
    clock = data.get("clock", 0) if isinstance(data, dict) else None
    if not isinstance(revoked, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) for k, v in revoked.items()):
        raise ValueError(f"the state file {path!r} does not hold revoked task ids (was it written by "
                         "another program?)")
    if isinstance(clock, bool) or not isinstance(clock, int) or clock < 0:
        raise ValueError(f"the state file {path!r} holds a clock that is not a whole number ({clock!r})")
    return State(revoked, clock)


def write_state(path: str, state: State) -> None:
    """Write ``state`` to ``path``, replacing it in one step (a crash leaves the old file)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump({"revoked": dict(state.revoked), "clock": state.clock}, file)
    os.replace(temporary, path)


def _dbm_kind(path: str) -> str:
    """``dbm.gnu``, ``dbm.ndbm``, ``dbm.dumb`` when ``path`` is (a file of) such a database."""
    stem, suffix = os.path.splitext(path)
    for candidate in (path, stem) if suffix in (".db", ".dat", ".dir", ".bak", ".pag") else (path,):
        try:
            kind = dbm.whichdb(candidate)
        except OSError:
            continue
        if kind:
            return kind
    return ""

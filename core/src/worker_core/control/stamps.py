"""Revoking by stamped headers (Celery's ``revoke_by_stamped_headers``): every task whose
message carries one of the flagged stamps is discarded, as Celery's canvas stamping marks every
task of a chain, group or chord with the same stamp, so a whole workflow is revoked at once.

The flagged stamps are kept by the worker (:class:`RevokedStamps`, on ``Worker.revoked_stamps``):
a message that arrives with one is discarded (stored REVOKED, acknowledged); the tasks this worker
holds and has not started are discarded at once; with ``terminate`` the running ones are killed
with the signal (TERM by default), as ``revoke`` with ``terminate`` does.
"""

from __future__ import annotations

import collections
import logging
import signal as signals
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..exceptions import PoolError
from .signals import signal_number

if TYPE_CHECKING:
    from ..request import Request
    from ..worker.worker import Worker

__all__ = ["RevokedStamps", "revoke_by_stamped_headers"]

logger = logging.getLogger("worker.control")


def _values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple, set, frozenset)) else [value]


class RevokedStamps:
    """The stamps flagged as revoked: each header's name with the values revoked under it."""

    def __init__(self) -> None:
        self._stamps: dict[str, list[Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._stamps)

    def add(self, headers: Mapping[str, Any]) -> None:
        for header, values in headers.items():
            known = self._stamps.setdefault(header, [])
            known.extend(value for value in _values(values) if value not in known)

    def match(self, stamps: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first of ``stamps`` (a request's) that is flagged, as ``{header: value}``."""
        for header, value in stamps.items():
            revoked = self._stamps.get(header)
            if not revoked or value is None:
                continue
            for stamped in _values(value):
                if stamped in revoked:
                    return {header: stamped}
        return None

    def as_dict(self) -> dict[str, list[Any]]:
        return {header: list(values) for header, values in self._stamps.items()}


def _headers(value: Any) -> dict[str, Any]:
    """Celery's argument: a mapping of header to stamp(s), or ``key=value`` words (a command line)."""
    if isinstance(value, Mapping):
        if all(isinstance(key, str) and key for key in value):
            return dict(value)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(item, str) and "=" in item
                                                             for item in value):
        found: dict[str, Any] = {}
        for item in value:
            key, _, stamp = item.partition("=")
            found.setdefault(key, []).append(stamp)
        return {key: stamps[0] if len(stamps) == 1 else stamps for key, stamps in found.items()}
    raise ValueError(f"headers must map stamped header names to their values, e.g. {{'mtask_id': 'ab12'}} "
                     f"or ['mtask_id=ab12'] (got {value!r})")


def _matching(requests: Iterable[Request], headers: RevokedStamps) -> dict[str, Request]:
    return {request.id: request for request in requests if headers.match(request.stamps)}


def revoke_by_stamped_headers(worker: Worker, headers: Any = None, terminate: Any = False, signal: Any = None,
                              **_celery: Any) -> dict[str, str]:
    """Celery's ``revoke_by_stamped_headers``, with its replies."""
    try:
        wanted = _headers(headers)
        signum = signal_number(signal if signal is not None else "TERM")
    except ValueError as exc:
        return {"error": f"revoke_by_stamped_headers: {exc}"}
    worker.revoked_stamps.add(wanted)
    these = RevokedStamps()
    these.add(wanted)
    consumer = worker.consumer
    held = consumer.reservations if consumer is not None else None
    if held is not None:
        waiting = _matching([*held.reserved, *held.rate_limits.waiting()], these)
        waiting.update(_matching([held.held_request(task) for task in held.eta_held], these))
        started = {task_id for task_id, request in waiting.items() if request in held.active}
        held.revoke_waiting([task_id for task_id in waiting if task_id not in started])
    logger.info("Stamped headers flagged as revoked: %s", wanted)
    if not terminate:
        return {"ok": f"headers {wanted} flagged as revoked, but not terminated"}
    terminated: collections.defaultdict[str, set[Any]] = collections.defaultdict(set)
    for request in list(held.active) if held is not None else []:
        hit = these.match(request.stamps)
        if hit is None or request.finished:
            continue
        logger.info("Terminating %s (%s): revoked by header %s", request.id, signals.Signals(signum).name,
                    hit)
        try:
            request.terminate(worker.pool, signum)
        except PoolError as exc:
            return {"error": f"cannot terminate {request.id}: {exc}"}
        for header, value in hit.items():
            terminated[header].add(value)
    if not terminated:
        return {"ok": f"headers {wanted} were not terminated"}
    return {"ok": f"headers {terminated} revoked"}

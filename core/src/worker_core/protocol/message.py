"""Building task messages exactly as Celery's protocol v2 writes them."""

from __future__ import annotations

import itertools
import os
import reprlib
import socket
from collections.abc import Mapping, Sequence
from datetime import datetime
from numbers import Real
from typing import Any

import attrs

from .times import in_seconds, parse_iso, to_iso, utcnow

__all__ = ["OutgoingMessage", "origin_name", "safe_repr", "safe_repr_as_built", "shown", "task_message"]

REPR_MAXSIZE = 1024


class _AsBuiltRepr(reprlib.Repr):
    """Dicts in the order they were built, as Celery's saferepr shows them (reprlib sorts)."""

    def repr_dict(self, value: Any, level: int) -> str:
        if not value or level <= 0:
            return super().repr_dict(value, level)
        shown = [f"{self.repr1(key, level - 1)}: {self.repr1(item, level - 1)}"
                 for key, item in itertools.islice(value.items(), self.maxdict)]
        if len(value) > self.maxdict:
            shown.append("...")
        return "{" + ", ".join(shown) + "}"


def _limited(shown: reprlib.Repr) -> reprlib.Repr:
    shown.maxstring = 200
    shown.maxother = 200
    shown.maxlist = shown.maxtuple = shown.maxdict = 30
    shown.maxlevel = 4
    # Signatures (canvas) are dicts and are shown as dicts, as Celery's saferepr shows them;
    # reprlib dispatches on the class's name, so other values pay nothing for this.
    for kind in ("Signature", "chain", "group", "chord", "xmap", "xstarmap", "chunks"):
        setattr(shown, f"repr_{kind}", shown.repr_dict)
    return shown


_repr = _limited(reprlib.Repr())
_repr_as_built = _limited(_AsBuiltRepr())


def safe_repr(value: Any, maxsize: int = REPR_MAXSIZE) -> str:
    """A bounded repr for ``argsrepr``/``kwargsrepr`` and logs; never raises."""
    try:
        text = _repr.repr(value)
    except Exception:  # a broken __repr__ must not break publishing
        text = f"<unrepresentable {type(value).__name__}>"
    return text if len(text) <= maxsize else text[: maxsize - 3] + "..."


def safe_repr_as_built(value: Any, maxsize: int = REPR_MAXSIZE) -> str:
    """:func:`safe_repr` with dicts in the order they were built, as Celery's saferepr shows
    them (the arguments of Celery's built-in canvas tasks)."""
    try:
        text = _repr_as_built.repr(value)
    except Exception:
        text = f"<unrepresentable {type(value).__name__}>"
    return text if len(text) <= maxsize else text[: maxsize - 3] + "..."


def shown(text: str, maxsize: int = 200) -> str:
    """Text from a message (a task name, an id) as a log line may carry it: as it is when it is
    short and printable, else bounded, and quoted when it holds line breaks or escapes."""
    if len(text) <= maxsize and text.isprintable():
        return text
    if not text.isprintable():
        return safe_repr(text, maxsize)
    return text[: maxsize - 3] + "..."


_ORIGIN: str | None = None


def origin_name() -> str:
    """``gen<pid>@<host>``: who sent a message (not a worker)."""
    global _ORIGIN
    pid = os.getpid()
    if _ORIGIN is None or not _ORIGIN.startswith(f"gen{pid}@"):
        _ORIGIN = f"gen{pid}@{socket.gethostname()}"
    return _ORIGIN


@attrs.frozen
class OutgoingMessage:
    """What a producer publishes: body ``(args, kwargs, embed)``, headers and properties."""

    body: tuple[Sequence[Any], Mapping[str, Any], Mapping[str, Any]]
    headers: dict[str, Any]
    properties: dict[str, Any]
    #: seconds until ``expires``, for the AMQP ``expiration`` property (None when not set)
    expiration: float | None = None


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a number of seconds (got {value!r} that is a {type(value).__name__})"
        )
    seconds = float(value)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number of seconds (got {value!r})")
    return seconds


def task_message(
    name: str,
    task_id: str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    countdown: float | None = None,
    eta: datetime | str | None = None,
    expires: float | datetime | str | None = None,
    retries: int = 0,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    root_id: str | None = None,
    parent_id: str | None = None,
    group_id: str | None = None,
    group_index: int | None = None,
    shadow: str | None = None,
    origin: str | None = None,
    ignore_result: bool = False,
    reply_to: str | None = None,
    callbacks: list[Any] | None = None,
    errbacks: list[Any] | None = None,
    chain: Sequence[Any] | None = None,
    chord: Any = None,
    argsrepr: str | None = None,
    kwargsrepr: str | None = None,
    stamps: Mapping[str, Any] | None = None,
    replaced_task_nesting: int = 0,
    now: datetime | None = None,
) -> OutgoingMessage:
    """A protocol v2 task message, header for header as Celery 5 sends it.

    ``countdown`` becomes an ISO ``eta``; a number ``expires`` becomes an ISO date (and the
    ``expiration`` seconds for brokers that drop expired messages).
    """
    if args is not None and not isinstance(args, (list, tuple)):
        raise TypeError(f"task args must be a list or tuple (got {type(args).__name__})")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"task kwargs must be a mapping (got {type(kwargs).__name__})")
    if argsrepr is None:
        argsrepr = safe_repr(args or ())
    if kwargsrepr is None:
        kwargsrepr = safe_repr(kwargs or {})
    args = list(args or ())
    kwargs = dict(kwargs or {})
    if countdown is not None:
        eta = in_seconds(_seconds("countdown", countdown), now)
    expiration = None
    if expires is not None:
        moment = expires
        if not isinstance(expires, (datetime, str)):
            moment = in_seconds(_seconds("expires", expires), now)
        elif isinstance(expires, str):
            moment = parse_iso(expires)
        assert isinstance(moment, datetime)
        expiration = max((moment - (now or utcnow())).total_seconds(), 0.0)
        expires = to_iso(moment)
    eta_text = to_iso(eta) if isinstance(eta, datetime) else eta
    headers: dict[str, Any] = {
        "lang": "py",
        "task": name,
        "id": task_id,
        "shadow": shadow,
        "eta": eta_text,
        "expires": expires,
        "group": group_id,
        "group_index": group_index,
        "retries": retries,
        "timelimit": [time_limit, soft_time_limit],
        "root_id": root_id or task_id,
        "parent_id": parent_id,
        "argsrepr": argsrepr,
        "kwargsrepr": kwargsrepr,
        "origin": origin or origin_name(),
        "ignore_result": ignore_result,
        "replaced_task_nesting": replaced_task_nesting or 0,
        "stamped_headers": sorted(stamps) if stamps else None,
        "stamps": dict(stamps or {}),
    }
    properties = {"correlation_id": task_id, "reply_to": reply_to or ""}
    embed = {"callbacks": callbacks, "errbacks": errbacks, "chain": chain, "chord": chord}
    return OutgoingMessage(body=(args, kwargs, embed), headers=headers, properties=properties,
                           expiration=expiration)

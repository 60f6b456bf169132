"""Dates on the wire: ISO 8601 with an offset, always compared in UTC."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

__all__ = ["in_seconds", "parse_iso", "to_iso", "utcnow"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def to_iso(moment: datetime) -> str:
    """ISO 8601 text; a naive datetime is taken to be UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.isoformat()


def parse_iso(text: str) -> datetime:
    """Parse ISO 8601 as Celery writes it (``+00:00`` or ``Z``); naive means UTC.

    :raise ValueError: the text is not an ISO 8601 date-time.
    """
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment


def in_seconds(seconds: float, now: datetime | None = None) -> datetime:
    return (now or utcnow()) + timedelta(seconds=seconds)

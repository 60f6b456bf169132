"""Celery's rate strings: ``"10/s"``, ``"100/m"``, ``"2/h"``."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["parse_rate"]

_PER = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate(value: Any) -> float:
    """Tasks per second from Celery's ``"10/s"``, ``"100/m"``, ``"2/h"`` (a bare number is per
    second); 0 for no limit (``None``, ``""``, ``0``)."""
    wrong = ValueError(f"a rate limit is a number of tasks per second or a string like '10/s', '100/m' "
                       f"or '2/h' (got {value!r})")
    if value is None or value == "":
        return 0.0
    if isinstance(value, bool):
        raise wrong
    if isinstance(value, (int, float)):
        count, per = float(value), 1.0
    elif isinstance(value, str):
        number, _, unit = value.strip().partition("/")
        per_unit = _PER.get(unit.strip().lower())
        try:
            count = float(number)
        except ValueError:
            raise wrong from None
        if per_unit is None:
            raise wrong
        per = per_unit
    else:
        raise wrong
    if not math.isfinite(count) or count < 0:
        raise wrong
    return count / per

"""The checks of a task's options (``@app.task(...)``, a Task class's attributes): each raises
``ConfigurationError`` saying which option, what it must be, and what it got."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..exceptions import ConfigurationError
from ..options import did_you_mean

__all__ = ["CELERY_ONLY", "bool_option", "exception_types", "mapping", "optional_bool", "optional_name",
           "optional_number", "priority", "unknown_option"]

#: Celery's task options this worker does not have.
CELERY_ONLY = frozenset({
    "typing", "expires", "store_errors_even_if_ignored", "send_events", "trail",
    "shared", "lazy", "throws", "compression", "exchange", "routing_key", "resultrepr_maxsize",
})


def exception_types(name: str, value: Any) -> tuple[type[BaseException], ...]:
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(f"{name} must be exception classes (got {item!r})")
    return tuple(items)


def optional_number(name: str, value: Any, *, whole: bool = False) -> Any:
    if value is None:
        return None
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value < 0:
        kind = "a whole number" if whole else "a number"
        raise ConfigurationError(f"{name} must be {kind}, 0 or more, or None (got {value!r})")
    return value


def optional_bool(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True, False or None (got {value!r})")
    return value


def bool_option(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False (got {value!r})")
    return value


def optional_name(name: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value or value != value.strip()):
        raise ConfigurationError(f"{name} must be a name without surrounding spaces, or None (got {value!r})")
    return value


def priority(name: str, value: Any) -> int | None:
    number: int | None = optional_number(name, value, whole=True)
    if number is not None and number > 255:
        raise ConfigurationError(f"{name} must be a whole number from 0 to 255, or None (got {value!r})")
    return number


def mapping(name: str, value: Any) -> dict[str, Any]:
    if value is not None and not isinstance(value, Mapping):
        raise ConfigurationError(f"{name} must be a mapping (got {value!r})")
    return dict(value or {})


def unknown_option(task: str, option: str, options: Sequence[str]) -> str:
    """Why ``option`` is refused: a Celery option this worker lacks, or a typo of one of ``options``."""
    if option in CELERY_ONLY:
        return (f"@app.task for {task!r}: {option!r} is a Celery task option this worker does not "
                f"have; remove it. The options are: {', '.join(options)}")
    return (f"@app.task for {task!r}: unknown option {option!r}.{did_you_mean(option, options)} "
            f"The options are: {', '.join(options)}")

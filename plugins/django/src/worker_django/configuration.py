"""The worker settings a ``TASKS`` entry's ``OPTIONS`` give (``broker_url``, ``result_backend``
and any other setting of :class:`worker_core.Settings`), checked once, each problem a line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker_core import Settings
from worker_core.exceptions import ConfigurationError, PluginError
from worker_core.options import did_you_mean, scheme_of

__all__ = ["DEFAULT_BROKER", "default_result_backend", "priority_scale", "worker_settings"]

#: the broker when ``OPTIONS`` name none: the embedded transport, a file in ``./.worker/``, for
#: development on one machine
DEFAULT_BROKER = "embedded://"


def worker_settings(options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The settings ``options`` give, and one line for each that cannot be taken (an unknown
    name, a value of the wrong kind), saying what to change.

    Without ``result_backend``, results go where the broker is when a result backend serves its
    scheme (Redis, PostgreSQL, the embedded file), so ``get_result`` works from the one setting.
    """
    known = Settings.names()
    settings: dict[str, Any] = {}
    problems: list[str] = []
    if not isinstance(options, Mapping):
        return {"broker_url": DEFAULT_BROKER}, [
            f"OPTIONS must be a dict of worker settings (got {type(options).__name__})"]
    for name, value in options.items():
        if not isinstance(name, str) or name not in known:
            problems.append(f"OPTIONS[{name!r}] is no worker setting.{did_you_mean(str(name), known)} "
                            f"The settings are those of worker_core.Settings (broker_url, "
                            f"result_backend, ...)")
            continue
        try:
            Settings(**{name: value})
        except (ConfigurationError, TypeError, ValueError) as exc:
            problems.append(f"OPTIONS[{name!r}]: {exc}")
            continue
        settings[name] = value
    settings.setdefault("broker_url", DEFAULT_BROKER)
    return settings, problems


def default_result_backend(settings: dict[str, Any], plugins: Any) -> None:
    """``result_backend`` set to the broker's URL when a result backend serves the broker's
    scheme and none is set (nor turned off with ``result_backend: None``)."""
    if "result_backend" in settings:
        return
    broker = str(settings["broker_url"]).split(";")[0]
    try:
        plugins.slot("result_backend", scheme_of(broker))
    except PluginError:
        return
    settings["result_backend"] = broker


def priority_scale(order: tuple[int, int] | None, priority: int) -> int | None:
    """Django's ``priority`` (-100 to 100, the higher first) on the transport's scale (see
    :class:`worker_core.slots.OrdersByPriority`): ``order`` is ``(first, last)``; None when the
    transport orders nothing by priority."""
    if order is None:
        return None
    first, last = order
    urgency = (priority + 100) / 200  # 0: served last, 1: served first
    return round(last + (first - last) * urgency)

"""The start-up banner: what this worker runs, from where, with which plugins."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from ..selection import redact

if TYPE_CHECKING:
    from ..app.base import App
    from ..plan import Plan
    from ..plugins.manager import PluginManager

__all__ = ["banner"]


def _version() -> str:
    try:
        return version("worker-core")
    except PackageNotFoundError:
        return "unknown"


def banner(app: App, plan: Plan, plugins: PluginManager, app_spec: str | None) -> str:
    options = plan.options
    implementations = plan.implementations()
    size = (f"autoscale {options.autoscale.min}..{options.autoscale.max}" if options.autoscale
            else f"concurrency {options.concurrency}")
    prefetch = (options.max_concurrency or 1) * options.prefetch_multiplier
    hooks = ", ".join(sorted(plugins.registered_names()))
    tasks = sorted(app.tasks)
    lines = [
        f"worker {_version()} ({platform.python_implementation()} {platform.python_version()}) "
        f"{options.hostname} pid {os.getpid()}",
        f"  app        {app_spec or app.main or '-'}",
        f"  transport  {' ; '.join(redact(url) for url in plan.selection.broker_urls)}"
        f"  [{implementations['transport']}]",
        f"  results    {redact(plan.selection.result_url)}  [{implementations['result_backend']}]",
        f"  pool       {size}, {options.scheduling} scheduling  [{implementations['pool']}]",
        f"  loop       {implementations['loop']}",
        f"  queues     {', '.join(options.queues)}",
        f"  prefetch   {prefetch} ({options.max_concurrency} x {options.prefetch_multiplier})",
        f"  plugins    {hooks}",
        f"  tasks      {len(tasks)}",
    ]
    lines.extend(f"    . {name}" for name in tasks)
    return "\n".join(lines)

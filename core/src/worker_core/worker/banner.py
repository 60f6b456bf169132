"""The start-up banner: what this worker runs, from where, with which plugins."""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

from .. import __version__
from ..redaction import redact_url

if TYPE_CHECKING:
    from ..app.base import App
    from ..plan import Plan
    from ..plugins.manager import PluginManager

__all__ = ["banner"]


def _version() -> str:
    return __version__


def _where(plan: Plan, kind: str) -> str:
    # The entry point's target, not its distribution: naming the distribution would mean
    # reading every installed distribution's metadata at start-up.
    entry = plan.selection.slots()[kind]
    return f"{entry.name} ({entry.value})"


def banner(app: App, plan: Plan, plugins: PluginManager, app_spec: str | None) -> str:
    options = plan.options
    implementations = {kind: _where(plan, kind) for kind in plan.selection.slots()}
    size = (f"autoscale {options.autoscale.min}..{options.autoscale.max}" if options.autoscale
            else f"concurrency {options.concurrency}")
    prefetch = (options.max_concurrency or 1) * options.prefetch_multiplier
    hooks = ", ".join(sorted(plugins.registered_names()))
    tasks = sorted(app.tasks)
    lines = [
        f"worker {_version()} ({platform.python_implementation()} {platform.python_version()}) "
        f"{options.hostname} pid {os.getpid()}",
        f"  app        {app_spec or app.main or '-'}",
        f"  transport  {' ; '.join(redact_url(url) for url in plan.selection.broker_urls)}"
        f"  [{implementations['transport']}]",
        f"  results    {redact_url(plan.selection.result_url)}  [{implementations['result_backend']}]",
        f"  pool       {size}, {options.scheduling} scheduling  [{implementations['pool']}]",
        f"  loop       {implementations['loop']}",
        f"  queues     {', '.join(options.queues)}",
        f"  prefetch   {prefetch} ({options.max_concurrency} x {options.prefetch_multiplier})",
        f"  plugins    {hooks}",
        f"  tasks      {len(tasks)}",
    ]
    lines.extend(f"    . {name}" for name in tasks)
    return "\n".join(lines)

"""The ``consumer`` plugin of worker-core: contributes the consumer blueprint's steps."""

from __future__ import annotations

import logging
from typing import Any

from ..bootsteps import Step
from ..hookspecs import hookimpl
from .steps import CONSUMER_STEPS

logger = logging.getLogger("worker.control")


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    if blueprint != "consumer":
        return []
    return list(CONSUMER_STEPS())


@hookimpl
def worker_init(worker: Any) -> None:
    # The Control step is simply left out: say so, or a silent ping would look like a dead worker.
    if not worker.options.remote_control:
        logger.warning("Remote control is off (worker_enable_remote_control is False): no control queue, "
                       "no reply to inspect or control commands, ping included; events are sent as usual")

"""The debugging commands Celery's worker answers, with its replies: ``report`` (what a bug
report needs), ``memsample``/``memdump`` (the worker process's resident memory, sampled and
summed up) and ``objgraph`` (a picture of what holds objects of a type alive).

Memory is read from ``/proc`` where there is one (Linux), else through psutil when it is
installed; Celery's worker needs psutil everywhere.
"""

from __future__ import annotations

import gc
import importlib.metadata
import io
import logging
import os
import platform
import tempfile
from typing import TYPE_CHECKING, Any

from ..options import scheme_of
from ..redaction import redact_url
from ..stash import StashKey
from .configuration import conf, humanize

if TYPE_CHECKING:
    from ..worker.worker import Worker

__all__ = ["humanbytes", "memdump", "memsample", "objgraph", "report", "resident_bytes"]

logger = logging.getLogger("worker.control")

#: the samples ``memsample`` took since the last ``memdump``
SAMPLES = StashKey[list[str]]()
UNITS = ((2**40, "TB"), (2**30, "GB"), (2**20, "MB"), (2**10, "KB"), (0, "b"))


def resident_bytes() -> int | None:
    """This process's resident set size now, None when it cannot be read here."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


def humanbytes(size: float) -> str:
    """Bytes as Celery shows them: ``62.316MB`` (five significant digits), ``512b``."""
    for divisor, unit in UNITS:
        if size >= divisor:
            value = size / divisor if divisor else size
            shown = int(value) if int(value) == value else f"{value:.5}"
            return f"{shown}{unit}"
    return f"{size}b"


def _rss() -> str | None:
    size = resident_bytes()
    return None if size is None else humanbytes(size)


def memsample(worker: Worker, **_celery: Any) -> str | None:
    """Sample the worker process's resident memory (None, as Celery's, where it cannot be read)."""
    sample = _rss()
    if sample is not None:
        worker.stash.setdefault(SAMPLES, []).append(sample)
    return sample


def memdump(worker: Worker, samples: Any = 10, **_celery: Any) -> str:
    """Celery's ``memdump``: up to ``samples`` of the samples taken (spread evenly over them),
    then the memory after a garbage collection; the samples are forgotten."""
    out = io.StringIO()
    if resident_bytes() is None:
        print("- rss: (cannot be read on this platform: install psutil).", file=out)
        return out.getvalue()
    try:
        wanted = max(int(samples), 1)
    except (TypeError, ValueError):
        wanted = 10
    taken = worker.stash.get(SAMPLES, [])
    step = max(len(taken) // wanted, 1)
    shown = taken if len(taken) <= wanted else taken[::step][:wanted]
    worker.stash[SAMPLES] = []
    gc.collect()
    if shown:
        print("- rss (sample):", file=out)
        for sample in shown:
            print(f"-    > {sample},", file=out)
    print(f"- rss (end): {_rss()}.", file=out)
    return out.getvalue()


def objgraph(worker: Worker, num: Any = 200, max_depth: Any = 10, type: Any = "Request",
             **_celery: Any) -> dict[str, str]:
    """Celery's ``objgraph``: draw what refers to up to ``num`` objects of the class named
    ``type`` (``Request`` by default) into a PNG file, and answer its name."""
    try:
        import objgraph as graphs  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return {"error": "objgraph is not installed on this worker: pip install objgraph (and Graphviz "
                         "for the picture) in the worker's environment"}
    try:
        count, depth = int(num), int(max_depth)
    except (TypeError, ValueError):
        return {"error": f"objgraph takes whole numbers for num and max_depth (got {num!r}, {max_depth!r})"}
    logger.info("Dumping graph for type %r", type)
    with tempfile.NamedTemporaryFile(prefix="cobjg", suffix=".png", delete=False) as file:
        objects = graphs.by_type(str(type))[:count]
        graphs.show_backrefs(objects, max_depth=depth, highlight=lambda value: value in objects,
                             filename=file.name)
    return {"filename": file.name}


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def report(worker: Worker, **_celery: Any) -> dict[str, str]:
    """Celery's ``report``: the software, the platform, the app, the broker and results, then
    the settings, as a text for a bug report (secrets hidden)."""
    plugins = sorted({f"{status.entry.distribution}:{status.entry.version}"
                      for status in worker.plugins.statuses()
                      if status.status == "loaded" and status.entry.distribution})
    software = [f"worker-core:{_version('worker-core')}", f"kombu:{_version('kombu')}",
                f"py:{platform.python_version()}", *plugins]
    lines = ["", "software -> " + " ".join(software[:3])]
    lines += ["            " + " ".join(software[index:index + 3]) for index in range(3, len(software), 3)]
    arch = ", ".join(part for part in platform.architecture() if part)
    app = type(worker.app)
    settings = worker.app.settings
    broker = worker.app.broker_urls[0] if worker.app.broker_urls else settings.broker_url
    lines += [
        f"platform -> system:{platform.system()} arch:{arch}",
        f"            kernel version:{platform.release()} imp:{platform.python_implementation()}",
        f"loader   -> {app.__module__}.{app.__qualname__}",
        f"settings -> transport:{scheme_of(str(broker))} "
        f"results:{redact_url(str(settings.result_backend)) if settings.result_backend else 'disabled'}",
        "",
    ]
    return {"ok": "\n".join(lines) + "\n" + humanize(conf(worker)) + "\n"}

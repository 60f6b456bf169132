"""worker: a task-queue worker whose every moving part is a plugin.

The public API is what this package exports (:data:`__all__`) and the names in the ``__all__`` of
the modules a plugin author works with (the built-in plugins use nothing else, and a test checks
their imports):

- every plugin: :mod:`worker_core.hookspecs` (every hook), :mod:`worker_core.slots` (every slot's
  interface and the optional capabilities), :mod:`worker_core.exceptions`,
  :mod:`worker_core.stash`, :mod:`worker_core.options` (the worker's options, a plugin's own
  options, ``did_you_mean`` for error messages), :mod:`worker_core.redaction` (hiding secrets in
  what a plugin logs or shows), :mod:`worker_core.election` (one leader among many workers, on
  a transport's leases), :mod:`worker_core.health` (the worker's liveness and readiness, and its
  HTTP listener) and :mod:`worker_core.testing` with its modules (the contract suites, a TCP proxy
  for fault tests);
- a transport: :mod:`worker_core.protocol` (Celery's message protocol v2, and what a broker-side
  delay leaves on a routing key), :mod:`worker_core.protocol.fastjson` (kombu's JSON, faster),
  :mod:`worker_core.protocol.packing` (the compact form of a parked message),
  :mod:`worker_core.transports.message` (messages of kombu's virtual transports that never fail
  to be built) and :mod:`worker_core.fastpaths` (checks that turn a fast path on library internals
  off when the library changed);
- a result backend: :mod:`worker_core.results` (task states, Celery's stored format, the result
  serializers);
- an autoscaler: :mod:`worker_core.autoscale` (the default autoscaler, to build on);
- a pool with an event loop: :mod:`worker_core.aio` (running ``async def`` tasks, and the threads
  that do the synchronous work around them);
- clients and workers: :mod:`worker_core.canvas` (signatures and workflows).

Every other module is an implementation detail and may change without notice.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import App, AsyncResult, Settings, Task
    from .app.groupresult import GroupResult, ResultSet
    from .bootsteps import Condition, Step
    from .canvas import Signature, chain, chord, chunks, group, maybe_signature, signature, xmap, xstarmap
    from .control.command import ControlCommand
    from .exceptions import ResultTimeout
    from .hookspecs import hookimpl
    from .options import OptionSpec, WorkerOptions
    from .request import Request
    from .stash import Stash, StashKey
    from .worker.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncResult",
    "Condition",
    "ControlCommand",
    "GroupResult",
    "OptionSpec",
    "Request",
    "ResultSet",
    "ResultTimeout",
    "Settings",
    "Signature",
    "Stash",
    "StashKey",
    "Step",
    "Task",
    "Worker",
    "WorkerOptions",
    "chain",
    "chord",
    "chunks",
    "group",
    "hookimpl",
    "maybe_signature",
    "signature",
    "xmap",
    "xstarmap",
]

# Each name is imported when first asked for: the tasks API pulls in kombu, which plugins that
# only declare steps should not pay for, and ``workerctl`` turns the garbage collector off before
# it imports the rest (see ``cli.run``).
_HOME = {
    "App": "app", "AsyncResult": "app", "Settings": "app", "Task": "app",
    "GroupResult": "app.groupresult", "ResultSet": "app.groupresult",
    "Condition": "bootsteps", "Step": "bootsteps", "ControlCommand": "control.command",
    "Signature": "canvas", "chain": "canvas", "chord": "canvas", "chunks": "canvas", "group": "canvas",
    "maybe_signature": "canvas", "signature": "canvas", "xmap": "canvas", "xstarmap": "canvas",
    "ResultTimeout": "exceptions",
    "hookimpl": "hookspecs",
    "OptionSpec": "options", "WorkerOptions": "options",
    "Request": "request", "Stash": "stash", "StashKey": "stash", "Worker": "worker.worker",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'worker_core' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

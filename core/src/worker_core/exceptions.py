"""The one exception tree of the project: every error the core raises on purpose."""

from __future__ import annotations

__all__ = [
    "AppImportError",
    "BackendDisabled",
    "BrokerStorageError",
    "CanvasError",
    "ChordError",
    "ConfigurationError",
    "ConnectionLostError",
    "ContentDisallowed",
    "DecodeError",
    "Ignore",
    "JobWithdrawn",
    "LeaseLost",
    "MaxRetriesExceededError",
    "NotImplementedYet",
    "NotRegistered",
    "PluginBlockedError",
    "PluginConflictError",
    "PluginError",
    "PluginLoadError",
    "PluginNotFoundError",
    "PoolError",
    "ProtocolError",
    "Reject",
    "ResultDecodeError",
    "ResultError",
    "ResultTimeout",
    "Retry",
    "SecurityError",
    "SoftTimeLimitExceeded",
    "StepConflictError",
    "StepCycleError",
    "StepError",
    "StepMissingError",
    "TaskError",
    "TaskRevokedError",
    "TimeLimitExceeded",
    "TopologyError",
    "TransportError",
    "UnpicklableError",
    "WorkerError",
    "WorkerLostError",
    "WorkerTerminate",
    "where_it_failed",
]


class WorkerError(Exception):
    """Base of every error the project raises on purpose."""


# -- configuration ------------------------------------------------------------------------------


class ConfigurationError(WorkerError, ValueError):
    """An option, setting, URL or argument has a value the worker cannot use."""


class AppImportError(ConfigurationError):
    """The app's module, or a module imported for its tasks, failed to import; the message names
    the file and line where it failed and the cause, the original exception is ``__cause__``
    (``workerctl worker -l DEBUG`` prints its traceback)."""

    @classmethod
    def of(cls, what: str, exc: BaseException) -> AppImportError:
        """``<what> failed to import: NameError: name 'x' is not defined (proj/tasks.py:3)``;
        raise it ``from exc``."""
        return cls(f"{what} failed to import: {where_it_failed(exc)}")


def where_it_failed(exc: BaseException) -> str:
    """``Type: message (file:line)``: the exception and where it was raised, the innermost frame
    outside the import machinery (for a syntax error, the line that does not parse)."""
    import traceback

    cause = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}:{exc.lineno})"
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if not frame.filename.startswith("<frozen ")]
    return f"{cause} ({frames[-1].filename}:{frames[-1].lineno})" if frames else cause


# -- plugins ------------------------------------------------------------------------------------


class PluginError(WorkerError):
    """A plugin cannot be found, loaded, chosen or used."""


class PluginLoadError(PluginError):
    """A plugin's entry point failed to import or register."""


class PluginConflictError(PluginError):
    """Two plugins claim the same name in the same slot or group."""


class PluginNotFoundError(PluginError, ConfigurationError):
    """A name was asked for that no installed plugin provides."""


class PluginBlockedError(PluginError, ConfigurationError):
    """A plugin was blocked with ``-p no:NAME`` but the command needs it, or it may not be blocked."""


class NotImplementedYet(PluginError, NotImplementedError):
    """A plugin is registered but its implementation has not been written yet."""


# -- bootsteps ----------------------------------------------------------------------------------


class StepError(WorkerError):
    """The bootstep graph cannot be resolved."""


class StepCycleError(StepError):
    """The steps' requirements form a cycle."""


class StepMissingError(StepError):
    """A step requires a step that no plugin contributes."""


class StepConflictError(StepError):
    """Two steps share a name, or a blueprint has two last steps."""


# -- transport ----------------------------------------------------------------------------------


class TransportError(WorkerError):
    """The broker cannot be reached or refused an operation."""


class TopologyError(TransportError):
    """A queue or exchange exists on the broker with arguments this worker cannot adopt."""


class BrokerStorageError(TransportError):
    """The broker cannot write (or read) its messages now: the embedded database on a full disk,
    an I/O error, a lock held past the busy timeout. The worker retries as after a lost connection."""


class ConnectionLostError(TransportError):
    """The broker connection was lost and could not be restored within the retry budget."""


class LeaseLost(TransportError):
    """A lease is no longer held by the one acting under it: another holder has it (a newer
    fencing token), or it lapsed; what was asked under it was not done."""


# -- messages and tasks -------------------------------------------------------------------------


class ProtocolError(WorkerError, ValueError):
    """A message does not follow the task protocol: missing or ill-typed headers or body."""


class CanvasError(WorkerError, ValueError):
    """A signature or workflow is malformed (a message's embed, a signature's dict) or cannot be
    sent as it is."""


class ContentDisallowed(ProtocolError):
    """A message's content type is not in the accepted list."""


class DecodeError(ProtocolError):
    """A message's body cannot be decoded with its content type and encoding."""


class SecurityError(ProtocolError):
    """A signed message's signature is missing, made by an unknown certificate, or wrong."""


class TaskError(WorkerError):
    """Base of errors about running a task."""


class NotRegistered(TaskError, KeyError):
    """A message names a task this worker does not know."""

    def __str__(self) -> str:
        return Exception.__str__(self)


class Retry(TaskError):
    """Raised by ``Task.retry()``: the task was re-sent and this run ends here."""

    def __init__(self, message: str | None = None, exc: BaseException | None = None,
                 when: float | None = None) -> None:
        self.message = message
        self.exc = exc
        self.when = when
        super().__init__(message, exc, when)

    def humanize(self) -> str:
        if self.when is None:
            return "now"
        return f"in {self.when:g}s"

    def __str__(self) -> str:
        if self.message:
            return self.message
        if self.exc is not None:
            return f"Retry {self.humanize()}: {self.exc!r}"
        return f"Retry {self.humanize()}"

    def __reduce__(self) -> tuple[type[Retry], tuple[str | None, BaseException | None, float | None]]:
        return self.__class__, (self.message, self.exc, self.when)


class Reject(TaskError):
    """Raised by a task to reject its message, requeued or not."""

    def __init__(self, reason: object = None, requeue: bool = False) -> None:
        self.reason = reason
        self.requeue = requeue
        super().__init__(reason, requeue)


class Ignore(TaskError):
    """Raised by a task to end its run without storing a state."""


class MaxRetriesExceededError(TaskError):
    """A task asked to retry more times than its ``max_retries``."""


class TimeLimitExceeded(TaskError):
    """A task ran past its hard time limit and its process was replaced."""


class SoftTimeLimitExceeded(TaskError):
    """Raised inside a task when it runs past its soft time limit."""


class WorkerLostError(TaskError):
    """The process running a task died before reporting a result.

    ``bystander=True``: the pool knows that another task running in the same process took it
    down; this one is sent again without counting toward the poison cap
    (``worker_redelivery_limit``)."""

    def __init__(self, *args: object, bystander: bool = False) -> None:
        super().__init__(*args)
        self.bystander = bystander


class ChordError(TaskError):
    """A chord's body cannot run: a header task failed (``Dependency <id> raised ...``), or its
    results could not be joined or the body could not be sent."""


class TaskRevokedError(TaskError):
    """A task was revoked, or expired before it could run."""


class UnpicklableError(TaskError):
    """Stands in for a task's exception that could not go from the process that ran it to the
    worker's as it is (it does not pickle, or not back): its class's name and module, its
    message (``str``) and its ``repr`` are kept."""

    def __init__(self, exc_type: str, exc_module: str, message: str, text: str) -> None:
        self.exc_type = exc_type
        self.exc_module = exc_module
        self.message = message
        self.text = text
        super().__init__(exc_type, exc_module, message, text)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.text


# -- pools --------------------------------------------------------------------------------------


class PoolError(WorkerError):
    """A pool cannot start, grow, shrink or run a job."""


class JobWithdrawn(WorkerError):
    """A pool gave a job back before starting it (the worker is stopping, or lost the broker
    connection its message came on): the message goes back to the broker."""


class WorkerTerminate(BaseException):
    """Raised into a task running inline (solo pool) when the worker stops cold.

    A BaseException, so a task's ``except Exception`` does not swallow it.
    """


# -- results ------------------------------------------------------------------------------------


class ResultError(WorkerError):
    """A result cannot be stored or read."""


class ResultDecodeError(ResultError, ValueError):
    """A stored result is in a format this app cannot read, or does not accept."""


class ResultTimeout(ResultError, TimeoutError):
    """Waiting for a task's result took longer than the timeout given."""


class BackendDisabled(ResultError):
    """Results were asked for but no result backend is configured."""

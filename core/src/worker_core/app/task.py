"""Tasks: ``@app.task`` functions you can call, send (``delay``/``apply_async``) and retry.

One module: every option of ``@app.task`` and what it means for calling, sending and retrying is the
Task class.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError, Ignore, MaxRetriesExceededError, Reject, Retry
from ..options import did_you_mean
from ..protocol import safe_repr
from ..rates import parse_rate
from .context import TaskContext, current_context, pushed

if TYPE_CHECKING:
    from ..canvas.signatures import Signature
    from .base import App
    from .result import AsyncResult

__all__ = ["Task", "backoff_countdown"]


def backoff_countdown(
    factor: float, retries: int, maximum: float, full_jitter: bool, rng: random.Random | None = None
) -> float:
    """Seconds before retry number ``retries + 1``: ``min(maximum, factor * 2**retries)``, and
    with full jitter a random whole number of seconds from 0 to that."""
    countdown = min(maximum, factor * (2**retries))
    if full_jitter:
        countdown = (rng or random).randrange(int(countdown) + 1)
    return max(0.0, float(countdown))


def _exception_types(name: str, value: Any) -> tuple[type[BaseException], ...]:
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(f"{name} must be exception classes (got {item!r})")
    return tuple(items)


def _optional_number(name: str, value: Any, *, whole: bool = False) -> Any:
    if value is None:
        return None
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value < 0:
        kind = "a whole number" if whole else "a number"
        raise ConfigurationError(f"{name} must be {kind}, 0 or more, or None (got {value!r})")
    return value


def _optional_bool(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True, False or None (got {value!r})")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False (got {value!r})")
    return value


def _optional_name(name: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value or value != value.strip()):
        raise ConfigurationError(f"{name} must be a name without surrounding spaces, or None (got {value!r})")
    return value


class Task:
    """A function registered with an :class:`App`.

    Calling it runs the function here and now; :meth:`delay` and :meth:`apply_async` send it to
    a worker. Options left as ``None`` follow the app's settings (``task_acks_late``, ...).
    """

    def __init__(
        self,
        app: App,
        fun: Callable[..., Any],
        *,
        name: str,
        bind: bool = False,
        acks_late: bool | None = None,
        ignore_result: bool | None = None,
        max_retries: int | None = 3,
        default_retry_delay: float | None = None,
        autoretry_for: Sequence[type[BaseException]] | type[BaseException] | None = None,
        dont_autoretry_for: Sequence[type[BaseException]] | type[BaseException] | None = None,
        retry_kwargs: Mapping[str, Any] | None = None,
        retry_backoff: bool | float = False,
        retry_backoff_max: float = 600,
        retry_jitter: bool = True,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        reject_on_worker_lost: bool | None = None,
        acks_on_failure_or_timeout: bool | None = None,
        track_started: bool | None = None,
        queue: str | None = None,
        priority: int | None = None,
        serializer: str | None = None,
        rate_limit: str | float | None = None,
        **unknown: Any,
    ) -> None:
        if not callable(fun):
            raise ConfigurationError(f"@app.task needs a function (got {fun!r})")
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a task name must be a non-empty string (got {name!r})")
        if unknown:
            raise ConfigurationError(_unknown_options(name, unknown))
        try:
            self.app = app
            self.fun = fun
            self.name = name
            self.bind = _bool("bind", bind)
            self._acks_late = _optional_bool("acks_late", acks_late)
            self._ignore_result = _optional_bool("ignore_result", ignore_result)
            self.max_retries = _optional_number("max_retries", max_retries, whole=True)
            self._default_retry_delay = _optional_number("default_retry_delay", default_retry_delay)
            self.autoretry_for = _exception_types("autoretry_for", autoretry_for)
            self.dont_autoretry_for = _exception_types("dont_autoretry_for", dont_autoretry_for)
            if retry_kwargs is not None and not isinstance(retry_kwargs, Mapping):
                raise ConfigurationError(f"retry_kwargs must be a mapping (got {retry_kwargs!r})")
            self.retry_kwargs = dict(retry_kwargs or {})
            if isinstance(retry_backoff, bool):
                self.retry_backoff = 1.0 if retry_backoff else 0.0
            else:
                self.retry_backoff = float(_optional_number("retry_backoff", retry_backoff) or 0)
            self.retry_backoff_max = float(_optional_number("retry_backoff_max", retry_backoff_max) or 0)
            self.retry_jitter = _bool("retry_jitter", retry_jitter)
            self.set_time_limits(soft_time_limit, time_limit)
            self._reject_on_worker_lost = _optional_bool("reject_on_worker_lost", reject_on_worker_lost)
            self._acks_on_failure_or_timeout = _optional_bool("acks_on_failure_or_timeout",
                                                              acks_on_failure_or_timeout)
            self._track_started = _optional_bool("track_started", track_started)
            self.queue = _optional_name("queue", queue)
            self.priority = _optional_number("priority", priority, whole=True)
            if self.priority is not None and self.priority > 255:
                raise ConfigurationError(
                    f"priority must be a whole number from 0 to 255, or None (got {priority!r})")
            self.serializer = _optional_name("serializer", serializer)
            self.rate_limit = rate_limit
        except ConfigurationError as exc:
            raise ConfigurationError(f"@app.task for {name!r}: {exc}") from None
        functools.update_wrapper(self, fun)

    @property
    def rate_limit(self) -> str | float | None:
        """At most this many starts of this task per worker: ``"10/s"``, ``"100/m"``, ``"2/h"``,
        or a number per second; None for no limit."""
        return self._rate_limit

    @rate_limit.setter
    def rate_limit(self, value: str | float | None) -> None:
        try:
            self.rate_per_second = parse_rate(value)
        except ValueError as exc:
            raise ConfigurationError(f"rate_limit: {exc}") from None
        self._rate_limit = value

    # -- options that follow the app's settings ------------------------------------------------

    @property
    def acks_late(self) -> bool:
        return self.app.settings.task_acks_late if self._acks_late is None else self._acks_late

    @property
    def ignore_result(self) -> bool:
        return self.app.settings.task_ignore_result if self._ignore_result is None else self._ignore_result

    @property
    def default_retry_delay(self) -> float:
        delay = self._default_retry_delay
        return float(self.app.settings.task_default_retry_delay if delay is None else delay)

    def set_time_limits(self, soft: float | None, hard: float | None) -> None:
        """Both limits at once (None: the app's ``task_soft_time_limit``/``task_time_limit``)."""
        soft = _optional_number("soft_time_limit", soft)
        hard = _optional_number("time_limit", hard)
        if hard and soft and soft >= hard:
            raise ConfigurationError(
                f"soft_time_limit ({soft:g}s) must be shorter than time_limit "
                f"({hard:g}s): the soft limit warns the task before the hard limit kills it"
            )
        self._soft_time_limit: float | None = soft
        self._time_limit: float | None = hard

    @property
    def time_limit(self) -> float | None:
        return self.app.settings.task_time_limit if self._time_limit is None else self._time_limit

    @property
    def soft_time_limit(self) -> float | None:
        limit = self._soft_time_limit
        return self.app.settings.task_soft_time_limit if limit is None else limit

    @property
    def reject_on_worker_lost(self) -> bool:
        value = self._reject_on_worker_lost
        return bool(self.app.settings.task_reject_on_worker_lost if value is None else value)

    @property
    def acks_on_failure_or_timeout(self) -> bool:
        value = self._acks_on_failure_or_timeout
        return self.app.settings.task_acks_on_failure_or_timeout if value is None else value

    @property
    def track_started(self) -> bool:
        return self.app.settings.task_track_started if self._track_started is None else self._track_started

    # -- running -------------------------------------------------------------------------------

    @property
    def request(self) -> TaskContext:
        """The current request while this task runs (``self.request`` in a bound task)."""
        return current_context()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task here, in this process, as a plain function call."""
        context = TaskContext(task=self.name, args=list(args), kwargs=dict(kwargs), called_directly=True)
        with pushed(context):
            return self.run(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The task's body, with automatic retries for ``autoretry_for`` exceptions."""
        call_args = (self, *args) if self.bind else args
        if not self.autoretry_for:
            return self.fun(*call_args, **kwargs)
        try:
            return self.fun(*call_args, **kwargs)
        except (Ignore, Retry, Reject):
            raise
        except self.autoretry_for as exc:
            if self.dont_autoretry_for and isinstance(exc, self.dont_autoretry_for):
                raise
            options = dict(self.retry_kwargs)
            if self.retry_backoff:
                options["countdown"] = backoff_countdown(
                    self.retry_backoff, self.request.retries, self.retry_backoff_max, self.retry_jitter
                )
            raise self.retry(exc=exc, **options) from None

    def retry(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Send this task again with ``retries + 1`` and end this run.

        :raise Retry: always when ``throw`` (the default): the worker acknowledges this run.
        :raise MaxRetriesExceededError: (or ``exc`` itself) once ``max_retries`` is used up.
        """
        request = self.request
        if request.called_directly or request.id is None:
            raise RuntimeError(
                f"{self.name}.retry() was called outside a worker; a task can only retry when a "
                f"worker runs it"
            ) from exc
        retries = request.retries + 1
        limit = self.max_retries if max_retries is None else max_retries
        args = request.args if args is None else list(args)
        kwargs = request.kwargs if kwargs is None else dict(kwargs)
        if limit is not None and retries > limit:
            if exc is not None:
                raise exc
            raise MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{safe_repr(args)} kwargs:{safe_repr(kwargs)}"
            )
        if eta is None and countdown is None:
            countdown = self.default_retry_delay
        hard, soft = request.timelimit
        try:
            self.app.send_task(
                self.name,
                args,
                kwargs,
                task_id=request.id,
                retries=retries,
                countdown=countdown,
                eta=eta,
                expires=request.expires,
                queue=(request.delivery_info or {}).get("routing_key") or options.pop("queue", None),
                priority=(request.delivery_info or {}).get("priority"),
                time_limit=hard,
                soft_time_limit=soft,
                root_id=request.root_id,
                parent_id=request.parent_id,
                group_id=request.group,
                ignore_result=request.ignore_result,
                **options,
            )
        except Exception as publish_error:
            raise Reject(publish_error, requeue=False) from publish_error
        signal = Retry(exc=exc, when=countdown if eta is None else None)
        if throw:
            raise signal
        return signal

    # -- sending -----------------------------------------------------------------------------------

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Send the task with these arguments; shortcut for :meth:`apply_async`."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: datetime | None = None,
        expires: float | datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        task_id: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Send the task to a worker and return its :class:`AsyncResult`; ``options`` are
        :meth:`App.send_task`'s (``link``, ``link_error``, ``shadow``, ``headers``, ...)."""
        options.setdefault("time_limit", self.time_limit)
        options.setdefault("soft_time_limit", self.soft_time_limit)
        options.setdefault("ignore_result", self.ignore_result)
        return self.app.send_task(
            self.name, args, kwargs, countdown=countdown, eta=eta, expires=expires,
            queue=queue or self.queue, priority=self.priority if priority is None else priority,
            task_id=task_id, serializer=self.serializer, **options,
        )

    def AsyncResult(self, task_id: str) -> AsyncResult:
        return self.app.AsyncResult(task_id)

    # -- signatures (see :mod:`worker_core.canvas`) ---------------------------------------------------

    def signature(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                  options: Mapping[str, Any] | None = None, **more: Any) -> Signature:
        """This task's call as data: ``add.signature((2, 2), countdown=10)``."""
        from ..canvas.signatures import Signature

        more.setdefault("app", self.app)
        return Signature(self, args, kwargs, options, **more)

    subtask = signature

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """``add.s(2, 2)``: a signature; applying it puts a previous result before these args."""
        return self.signature(args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """``add.si(2, 2)``: an immutable signature, which ignores a previous result."""
        return self.signature(args, kwargs, immutable=True)

    def map(self, it: Iterable[Any]) -> Signature:
        """One ``celery.map`` task calling this task with each item of ``it`` in turn."""
        from ..canvas.maps import xmap

        return xmap(self.s(), it, app=self.app)

    def starmap(self, it: Iterable[Any]) -> Signature:
        """One ``celery.starmap`` task calling this task with ``*item`` for each item of ``it``."""
        from ..canvas.maps import xstarmap

        return xstarmap(self.s(), it, app=self.app)

    def chunks(self, it: Iterable[Any], n: int) -> Signature:
        """``it`` in parts of ``n``, each a ``celery.starmap`` task, sent together as a group."""
        from ..canvas.maps import chunks

        return chunks(self.s(), it, n, app=self.app)

    def __repr__(self) -> str:
        return f"<task {self.name}>"


#: The keyword options ``@app.task(...)`` takes.
OPTIONS = tuple(
    parameter for parameter in inspect.signature(Task.__init__).parameters
    if parameter not in ("self", "app", "fun", "unknown")
)
#: Celery's task options this worker does not have.
CELERY_ONLY = frozenset({
    "typing", "expires", "store_errors_even_if_ignored", "send_events", "trail", "base",
    "shared", "lazy", "throws", "compression", "exchange", "routing_key", "resultrepr_maxsize",
})


def _unknown_options(task: str, unknown: Mapping[str, Any]) -> str:
    option = sorted(unknown)[0]
    if option in CELERY_ONLY:
        return (f"@app.task for {task!r}: {option!r} is a Celery task option this worker does not "
                f"have; remove it. The options are: {', '.join(OPTIONS)}")
    return (f"@app.task for {task!r}: unknown option {option!r}.{did_you_mean(option, OPTIONS)} "
            f"The options are: {', '.join(OPTIONS)}")

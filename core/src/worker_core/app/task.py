"""Tasks: ``@app.task`` functions and Task classes, which you can call, send
(``delay``/``apply_async``), retry, and follow (``update_state``, the handlers).

One module: what each task option means for calling, sending, retrying and storing is the Task
class, as in Celery (the options' checks are in :mod:`.task_options`, the handlers' calls in
:mod:`.handlers`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import random
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, overload

import attrs

from ..aio import BlockingThreads, blocking_executor
from ..canvas import maps
from ..canvas import replace as handover
from ..canvas.signatures import Signature
from ..exceptions import ConfigurationError, Ignore, MaxRetriesExceededError, Reject, Retry
from ..protocol import safe_repr
from ..protocol.delays import strip_delay
from ..protocol.headers import DEAD_LETTER_HEADERS
from ..rates import parse_rate
from ..results.meta import EXCEPTION_STATES
from ..results.outcome import Outcome, store_outcome
from . import task_options as check
from .awaiting import client_of
from .context import TaskContext, current_context, pushed, workflow_options
from .handlers import HANDLERS, ExceptionInfo, overridden

if TYPE_CHECKING:
    from .base import App
    from .result import AsyncResult

__all__ = ["FOLLOW_SETTINGS", "OPTIONS", "FollowsSetting", "Task", "backoff_countdown"]

_MISSING = object()


def backoff_countdown(
    factor: float, retries: int, maximum: float, full_jitter: bool, rng: random.Random | None = None
) -> float:
    """Seconds before retry number ``retries + 1``: ``min(maximum, factor * 2**retries)``, and
    with full jitter a random whole number of seconds from 0 to that."""
    countdown = min(maximum, factor * (2**retries))
    if full_jitter:
        countdown = (rng or random).randrange(int(countdown) + 1)
    return max(0.0, float(countdown))


#: The options that follow an app setting while they are None: a descriptor each on Task (the
#: value kept under ``_<name>``), so a subclass's class attribute of the same name is that
#: option's default; so is ``rate_limit`` (a property that parses the rate).
FOLLOW_SETTINGS = ("acks_late", "ignore_result", "default_retry_delay", "time_limit", "soft_time_limit",
                   "reject_on_worker_lost", "acks_on_failure_or_timeout", "track_started", "rate_limit")

T = TypeVar("T")


class FollowsSetting(Generic[T]):
    """A task option that is the app's setting ``setting`` while the task's value (kept as
    ``_<name>``, set by assigning the option) is None."""

    def __init__(self, setting: str, convert: Callable[[Any], T] | None = None) -> None:
        self.setting = setting
        self.convert = convert
        self.private = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.private = f"_{name}"

    @overload
    def __get__(self, task: None, owner: type) -> FollowsSetting[T]: ...

    @overload
    def __get__(self, task: Task, owner: type) -> T: ...

    def __get__(self, task: Task | None, owner: type) -> FollowsSetting[T] | T:
        if task is None:
            return self
        value = getattr(task, self.private)
        if value is None:
            value = getattr(task.app.settings, self.setting)
        return value if self.convert is None else self.convert(value)

    def __set__(self, task: Task, value: T | None) -> None:
        setattr(task, self.private, value)


class Task:
    """A task: a function registered with ``@app.task``, or a subclass whose :meth:`run` is the
    task's body, registered with ``app.register_task``, as in Celery.

    Its options are its attributes. A subclass's class attributes are the defaults of every task
    made from it (``@app.task(base=MyTask)``, ``App(task_cls=MyTask)``), its methods and
    properties are there for ``self`` in bound tasks, and the handlers it overrides
    (:meth:`before_start`, :meth:`on_success`, :meth:`on_failure`, :meth:`on_retry`,
    :meth:`after_return`) are called where Celery calls them. The options given to
    ``@app.task`` win over the class's; those left None follow the app's settings
    (``task_acks_late``, ...).

    Calling a task runs it here and now; :meth:`delay` and :meth:`apply_async` send it to a worker.
    """

    #: the task's name: a class-based task may set it, else it is ``module.ClassName``
    name: str = ""
    #: pass the task itself to the function as its first argument (``self``)
    bind: bool = False
    max_retries: int | None = 3
    autoretry_for: tuple[type[BaseException], ...] = ()
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    retry_kwargs: Mapping[str, Any] = types.MappingProxyType({})
    retry_backoff: float | bool = False
    retry_backoff_max: float = 600
    retry_jitter: bool = True
    queue: str | None = None
    priority: int | None = None
    #: how its messages are serialized (None: the task_serializer setting)
    serializer: str | None = None
    #: how its results are stored (None: the result_serializer setting)
    result_serializer: str | None = None
    # the defaults of the options that follow the app's settings (see FOLLOW_SETTINGS)
    _acks_late: bool | None = None
    _ignore_result: bool | None = None
    _default_retry_delay: float | None = None
    _time_limit: float | None = None
    _soft_time_limit: float | None = None
    _reject_on_worker_lost: bool | None = None
    _acks_on_failure_or_timeout: bool | None = None
    _track_started: bool | None = None
    _rate_limit: str | float | None = None
    rate_per_second: float | None = None

    #: the handlers this task overrides, decided when it is registered: the worker calls no other
    handlers: frozenset[str] = frozenset()
    #: whether the worker calls the task itself (its class overrides ``__call__``) or its run
    overrides_call: bool = False
    #: whether the task's body is an ``async def`` (decided when it is registered): a pool with
    #: an event loop awaits it there, the others run it to completion on a loop of their own
    is_async: bool = False
    _names_shadow: bool = False

    app: App
    fun: Callable[..., Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # ``acks_late = True`` in a subclass would hide the property that makes None follow the
        # app's setting: the value becomes the property's default instead.
        for option in FOLLOW_SETTINGS:
            value = cls.__dict__.get(option, _MISSING)
            if value is _MISSING or hasattr(value, "__get__"):  # a property of the class's own stays
                continue
            setattr(cls, f"_{option}", value)
            delattr(cls, option)

    def setup_for(self, app: App, name: str, fun: Callable[..., Any] | None,
                  options: Mapping[str, Any]) -> None:
        """Bind this task to ``app`` as ``name``: ``fun`` is its body (None for a class-based
        task, whose body is its run method), ``options`` win over its class's attributes. Done
        once, by ``@app.task`` and ``app.register_task``."""
        given = dict(options)
        cls = type(self)
        for option in sorted(given):
            if option not in OPTIONS and not _declared_by_subclass(cls, option):
                raise ConfigurationError(check.unknown_option(name, option, OPTIONS))

        def value(option: str, attribute: str | None = None) -> tuple[str, Any]:
            """The option given, else the class's default, with the name an error should use."""
            if option in given:
                return option, given.pop(option)
            attribute = attribute or option
            # set by the class's own __init__, else by the class or a base between it and Task
            owner = cls if attribute in vars(self) else next(
                (base for base in cls.__mro__ if attribute in vars(base)), Task)
            return (option if owner is Task else f"{owner.__qualname__}.{option}"), getattr(self, attribute)

        try:
            self.app = app
            self.name = name
            self.bind = check.bool_option(*value("bind"))
            self._acks_late = check.optional_bool(*value("acks_late", "_acks_late"))
            self._ignore_result = check.optional_bool(*value("ignore_result", "_ignore_result"))
            self.max_retries = check.optional_number(*value("max_retries"), whole=True)
            self._default_retry_delay = check.optional_number(*value("default_retry_delay",
                                                                     "_default_retry_delay"))
            self.autoretry_for = check.exception_types(*value("autoretry_for"))
            self.dont_autoretry_for = check.exception_types(*value("dont_autoretry_for"))
            self.retry_kwargs = check.mapping(*value("retry_kwargs"))
            label, backoff = value("retry_backoff")
            if isinstance(backoff, bool):
                self.retry_backoff = 1.0 if backoff else 0.0
            else:
                self.retry_backoff = float(check.optional_number(label, backoff) or 0)
            self.retry_backoff_max = float(check.optional_number(*value("retry_backoff_max")) or 0)
            self.retry_jitter = check.bool_option(*value("retry_jitter"))
            soft = value("soft_time_limit", "_soft_time_limit")[1]
            self.set_time_limits(soft, value("time_limit", "_time_limit")[1])
            self._reject_on_worker_lost = check.optional_bool(*value("reject_on_worker_lost",
                                                                     "_reject_on_worker_lost"))
            self._acks_on_failure_or_timeout = check.optional_bool(*value("acks_on_failure_or_timeout",
                                                                          "_acks_on_failure_or_timeout"))
            self._track_started = check.optional_bool(*value("track_started", "_track_started"))
            self.queue = check.optional_name(*value("queue"))
            self.priority = check.priority(*value("priority"))
            self.serializer = check.optional_name(*value("serializer"))
            self.result_serializer = check.optional_name(*value("result_serializer"))
            self.rate_limit = value("rate_limit", "_rate_limit")[1]
            methods = {option: given.pop(option) for option in (*HANDLERS, "shadow_name") if option in given}
            for option, method in methods.items():
                if not callable(method):
                    raise ConfigurationError(
                        f"{option} must be a function taking the task first (got {method!r})")
                setattr(self, option, types.MethodType(method, self))
            for option, extra in given.items():  # attributes the base class declares for its own use
                setattr(self, option, extra)
        except ConfigurationError as exc:
            raise ConfigurationError(f"@app.task for {name!r}: {exc}") from None
        if fun is not None:
            if not callable(fun):
                raise ConfigurationError(f"@app.task needs a function (got {fun!r})")
            self.fun = fun
            # as Celery makes it: the function itself, or a method of this task when bound
            self.run = types.MethodType(fun, self) if self.bind else fun  # type: ignore[method-assign]
            functools.update_wrapper(self, fun)
        else:
            if cls.run is Task.run:
                raise ConfigurationError(
                    f"task {name!r} ({cls.__module__}.{cls.__qualname__}) has no body: a class-based "
                    f"task defines run(self, ...)")
            self.fun = cls.run
        self.is_async = inspect.iscoroutinefunction(self.fun)
        if self.autoretry_for:
            self.run = self._autoretrying(self.run)  # type: ignore[method-assign]
        self.handlers = overridden(self, Task, frozenset(methods))
        self.overrides_call = cls.__call__ is not Task.__call__
        self._names_shadow = "shadow_name" in methods or cls.shadow_name is not Task.shadow_name

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

    @property
    def module(self) -> str:
        """The module that defines the task's body (the one remote ``pool_restart`` reloads)."""
        module = getattr(self.fun, "__module__", None)
        return module if isinstance(module, str) else type(self).__module__

    def info_item(self, name: str) -> Any:
        """The attribute ``name`` as ``inspect registered`` shows it next to the task's name
        (Celery's task info items: ``rate_limit``, ``acks_late``, ...); None when the task has
        no such value, or it is a method."""
        try:
            value = getattr(self, name, None)
        except Exception:
            return None
        return None if callable(value) else value

    # -- options that follow the app's settings while they are None ---------------------------

    acks_late: FollowsSetting[bool] = FollowsSetting("task_acks_late")
    ignore_result: FollowsSetting[bool] = FollowsSetting("task_ignore_result")
    default_retry_delay: FollowsSetting[float] = FollowsSetting("task_default_retry_delay", float)
    time_limit: FollowsSetting[float | None] = FollowsSetting("task_time_limit")
    soft_time_limit: FollowsSetting[float | None] = FollowsSetting("task_soft_time_limit")
    reject_on_worker_lost: FollowsSetting[bool] = FollowsSetting("task_reject_on_worker_lost", bool)
    acks_on_failure_or_timeout: FollowsSetting[bool] = FollowsSetting("task_acks_on_failure_or_timeout")
    track_started: FollowsSetting[bool] = FollowsSetting("task_track_started")

    def set_time_limits(self, soft: float | None, hard: float | None) -> None:
        """Both limits at once (None: the app's ``task_soft_time_limit``/``task_time_limit``)."""
        soft = check.optional_number("soft_time_limit", soft)
        hard = check.optional_number("time_limit", hard)
        if hard and soft and soft >= hard:
            raise ConfigurationError(
                f"soft_time_limit ({soft:g}s) must be shorter than time_limit "
                f"({hard:g}s): the soft limit warns the task before the hard limit kills it"
            )
        self._soft_time_limit = soft
        self._time_limit = hard

    # -- running -------------------------------------------------------------------------------

    @property
    def request(self) -> TaskContext:
        """The current request while this task runs (``self.request`` in a bound task)."""
        return current_context()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task here, in this process, as a plain function call. (A class overriding
        ``__call__`` and calling this from it is run so by the worker, with the worker's request.)"""
        current = current_context()
        if current.task == self.name and not current.called_directly:
            context = attrs.evolve(current, args=list(args), kwargs=dict(kwargs))
        else:
            context = TaskContext(task=self.name, args=list(args), kwargs=dict(kwargs), called_directly=True)
        with pushed(context):
            return self.run(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The task's body: the function given to ``@app.task``, or a class-based task's own."""
        raise NotImplementedError(f"task {self.name!r} defines no run method")

    def _autoretrying(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """``run`` retrying the task on ``autoretry_for`` exceptions (not ``dont_autoretry_for``
        ones), with ``retry_kwargs`` and the backoff, as Celery wraps it."""
        retry_on, never = self.autoretry_for, self.dont_autoretry_for

        def retry_for(exc: BaseException) -> BaseException | None:
            """The retry to raise for ``exc``, or None to let it through."""
            if isinstance(exc, (Ignore, Retry, Reject)) or not isinstance(exc, retry_on):
                return None
            if never and isinstance(exc, never):
                return None
            options = dict(self.retry_kwargs)
            if self.retry_backoff:
                options["countdown"] = backoff_countdown(
                    self.retry_backoff, self.request.retries, self.retry_backoff_max, self.retry_jitter
                )
            return self.retry(exc=exc, **options)

        if self.is_async:  # the exception comes out of the coroutine, when it is awaited
            @functools.wraps(run)
            async def autoretrying_coroutine(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await run(*args, **kwargs)
                except BaseException as exc:
                    retry = await _off_the_loop(retry_for, exc)  # the retry is published
                    if retry is None:
                        raise
                    raise retry from None

            return autoretrying_coroutine

        @functools.wraps(run)
        def autoretrying(*args: Any, **kwargs: Any) -> Any:
            try:
                return run(*args, **kwargs)
            except BaseException as exc:
                retry = retry_for(exc)
                if retry is None:
                    raise
                raise retry from None

        return autoretrying

    def update_state(self, task_id: str | None = None, state: str | None = None, meta: Any = None,
                     traceback: str | None = None) -> None:
        """Store ``state`` with ``meta`` as the task's result, as Celery does: a state of the
        task's own (``"PROGRESS"``, with ``meta={"done": 3, "total": 10}``) that clients read as
        ``AsyncResult.state`` and ``.info`` until the task ends. ``task_id`` defaults to the
        running task's; an exception as ``meta`` of an exception state (FAILURE, RETRY,
        REVOKED) is stored as Celery encodes exceptions.
        """
        request = self.request
        task_id = task_id or request.id
        if not task_id:
            raise RuntimeError(f"{self.name}.update_state() needs task_id= outside a worker")
        if not isinstance(state, str) or not state:
            raise ValueError(
                f"update_state needs a state, a non-empty string such as 'PROGRESS' (got {state!r})")
        fields = request.as_dict() if request.id else None
        if state in EXCEPTION_STATES and isinstance(meta, BaseException):
            outcome = Outcome(state, exception=meta, traceback=traceback, task_id=task_id, request=fields)
        else:
            outcome = Outcome(state, value=meta, traceback=traceback, task_id=task_id, request=fields)
        store_outcome(self.app.backend, outcome, self.result_serializer)

    # -- handlers: the worker calls those a task overrides, where and when Celery calls them -----

    def before_start(self, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Called where the task runs, just before it runs (after ``task_prerun``): an exception
        raised here fails the task, as in Celery."""

    def on_success(self, retval: Any, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Called where the task ran, once it returned ``retval`` and its result is stored."""

    def on_failure(self, exc: BaseException, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                   einfo: ExceptionInfo) -> None:
        """Called once the task raised ``exc`` and its FAILURE is stored: where the task ran, or
        in the worker's main process after a hard time limit killed its process (as in Celery)."""

    def on_retry(self, exc: BaseException | None, task_id: str, args: Sequence[Any],
                 kwargs: Mapping[str, Any], einfo: ExceptionInfo | None) -> None:
        """Called where the task ran, once it asked to be retried (``exc`` is the reason given to
        :meth:`retry`) and its RETRY is stored; in the worker's main process, with ``einfo``
        None, for a running task cancelled after a lost connection (as in Celery)."""

    def after_return(self, status: str, retval: Any, task_id: str, args: Sequence[Any],
                     kwargs: Mapping[str, Any], einfo: ExceptionInfo | None) -> None:
        """Called after :meth:`on_success` or :meth:`on_failure`, with the task's state (SUCCESS
        or FAILURE) and what it returned or raised; ``einfo`` is None, as in Celery."""

    def shadow_name(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                    options: Mapping[str, Any]) -> str | None:
        """The name worker logs and monitors show for this call instead of the task's (None: the
        task's own), as Celery asks it when sending; ``apply_async(shadow=...)`` wins."""
        return None

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
        # the message's own headers go with the retry, as in Celery, but not dead-lettering's
        headers = {key: value for key, value in (request.headers or {}).items()
                   if key not in DEAD_LETTER_HEADERS}
        headers.update(options.pop("headers", None) or {})
        if headers:
            options["headers"] = headers
        options.setdefault("shadow", request.shadow)
        if request.reply_to:  # the client waiting for it (rpc://) gets what the retry ends in
            options.setdefault("reply_to", request.reply_to)
        info = request.delivery_info or {}
        queue = options.pop("queue", None)
        if info.get("routing_key") and queue is None:
            # back the way it came, as Celery retries: its exchange and routing key (without the
            # delay bits a broker-side countdown put before it)
            options.setdefault("exchange", info.get("exchange") or "")
            options.setdefault("routing_key", strip_delay(str(info["routing_key"])))
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
                queue=queue,
                priority=info.get("priority"),
                time_limit=hard,
                soft_time_limit=soft,
                root_id=request.root_id,
                parent_id=request.parent_id,
                group_id=request.group,
                ignore_result=request.ignore_result,
                **{**workflow_options(request), **options},
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
        :meth:`App.send_task`'s (``link``, ``link_error``, ``shadow``, ``headers``, ...); without
        ``shadow``, the task's :meth:`shadow_name` names the call."""
        if self._names_shadow and not options.get("shadow"):
            options["shadow"] = self.shadow_name(tuple(args or ()), dict(kwargs or {}), options)
        options.setdefault("time_limit", self.time_limit)
        options.setdefault("soft_time_limit", self.soft_time_limit)
        options.setdefault("ignore_result", self.ignore_result)
        options.setdefault("serializer", self.serializer)  # the call's own wins, as in Celery
        return self.app.send_task(
            self.name, args, kwargs, countdown=countdown, eta=eta, expires=expires,
            queue=queue or self.queue, priority=self.priority if priority is None else priority,
            task_id=task_id, **options,
        )

    async def adelay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """:meth:`delay` from async code: ``await add.adelay(2, 3)`` sends without blocking the
        event loop (the send runs in the app's sending thread)."""
        return await self.aapply_async(args, kwargs)

    async def aapply_async(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                           **options: Any) -> AsyncResult:
        """:meth:`apply_async` from async code, without blocking the event loop; then ``await
        result.aget(timeout=...)``."""
        return await client_of(self.app).call(self.apply_async, args, kwargs, **options)

    def AsyncResult(self, task_id: str) -> AsyncResult:
        return self.app.AsyncResult(task_id)

    # -- signatures (see :mod:`worker_core.canvas`) ---------------------------------------------------

    def signature(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                  options: Mapping[str, Any] | None = None, **more: Any) -> Signature:
        """This task's call as data: ``add.signature((2, 2), countdown=10)``."""
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
        return maps.xmap(self.s(), it, app=self.app)

    def starmap(self, it: Iterable[Any]) -> Signature:
        """One ``celery.starmap`` task calling this task with ``*item`` for each item of ``it``."""
        return maps.xstarmap(self.s(), it, app=self.app)

    def chunks(self, it: Iterable[Any], n: int) -> Signature:
        """``it`` in parts of ``n``, each a ``celery.starmap`` task, sent together as a group."""
        return maps.chunks(self.s(), it, n, app=self.app)

    def replace(self, sig: Signature) -> NoReturn:
        """Replace this running task with ``sig``, which takes over its id and its place in its
        workflow; the task ends here (``return self.replace(sig)`` reads best). See
        :func:`worker_core.canvas.replace.replace`."""
        handover.replace(self, sig)

    def add_to_chord(self, sig: Signature, lazy: bool = False) -> Any:
        """Add ``sig`` to the chord this running task is part of (its body waits for it too).
        See :func:`worker_core.canvas.replace.add_to_chord`."""
        return handover.add_to_chord(self, sig, lazy)

    def __repr__(self) -> str:
        return f"<task {self.name}>"


#: The keyword options ``@app.task(...)`` takes (with ``base``'s own attributes).
OPTIONS = ("name", "base", "bind", "acks_late", "ignore_result", "max_retries", "default_retry_delay",
           "autoretry_for", "dont_autoretry_for", "retry_kwargs", "retry_backoff", "retry_backoff_max",
           "retry_jitter", "time_limit", "soft_time_limit", "reject_on_worker_lost",
           "acks_on_failure_or_timeout", "track_started", "queue", "priority", "serializer",
           "result_serializer", "rate_limit", "shadow_name", *HANDLERS)


def _declared_by_subclass(cls: type[Task], option: str) -> bool:
    """Whether a class between ``cls`` and Task declares ``option`` (a base's own attribute)."""
    return any(option in vars(base) for base in cls.__mro__ if issubclass(base, Task) and base is not Task)


if TYPE_CHECKING:
    # mypy proves a Task is what a signature of it sends and calls.
    from ..canvas.interface import CanvasTask, RunningTask

    _CANVAS_TASK: type[CanvasTask] = Task
    _RUNNING_TASK: type[RunningTask] = Task


async def _off_the_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in the task's context, in a thread of the blocking executor where a pool
    with an event loop set one (:func:`worker_core.aio.set_blocking_executor`), else here."""
    threads = blocking_executor()
    if threads is None:
        return fn(*args)
    context = contextvars.copy_context()
    if isinstance(threads, BlockingThreads):
        return await threads.call(context.run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(threads, context.run, fn, *args)

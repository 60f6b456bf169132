"""``App``: settings, the task registry, sending tasks and reading results.

One module: ``App`` is the user's single object (settings, tasks, sending, results, hooks, signing),
as Celery's app is.
"""

from __future__ import annotations

import os
import threading
import types
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, overload

from .. import signing
from ..canvas.signatures import Signature, maybe_signature
from ..exceptions import ConfigurationError, NotRegistered, PluginError
from ..hookspecs import hookimpl
from ..options import did_you_mean, scheme_of
from ..plugins.manager import PluginManager
from ..protocol import task_message
from ..protocol.fastjson import dumps as json_dumps
from ..protocol.times import parse_iso
from ..selection import default_result_url
from ..slots import AdoptsQueues, DelaysOnBroker, RepliesToSender, ResultBackend, Transport
from . import sending
from .awaiting import client_of, close_client
from .broker import broker_urls, connect_for_publishing, transport_for
from .context import add_child, current_context
from .groupresult import GroupResult
from .queues import Topology
from .result import AsyncResult
from .routes import Destination, Router
from .settings import Settings, check_names, from_object, settings_from
from .task import Task

if TYPE_CHECKING:
    from ..signing.serializer import SignedSerializer
    from .groupresult import GroupResult as _GroupResult

    # Inside App the name AsyncResult is the method, so annotations there use this alias.
    from .result import AsyncResult as _AsyncResult

__all__ = ["App", "Config"]

_Task = Task  # inside App, "Task" names the property

#: Retries of a publish while the broker is briefly unreachable (as Celery's default policy).
PUBLISH_RETRY_POLICY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


class Config:
    """``app.conf``: read settings as attributes; change them with ``update`` or assignment."""

    def __init__(self, app: App) -> None:
        object.__setattr__(self, "_app", app)

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._app.settings, name)
        except AttributeError:
            check_names([name])
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        self.update({name: value})

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def update(self, changes: Mapping[str, Any] | None = None, **more: Any) -> None:
        self._app._set(dict(changes or {}, **more))

    def __repr__(self) -> str:
        return repr(self._app.settings)


class App:
    """A task application: ``app = App("proj", broker="redis://...")``.

    :param main: the app's name; task names default to ``module.function``, and tasks defined in
        ``__main__`` are named after the app.
    :param broker: broker URL(s), ``;``-separated for failover (default: the embedded transport).
    :param backend: result backend URL (default: the transport's own when it has one, else
        results are disabled).
    :param config_source: a mapping, module or object with settings (see ``Settings``).
    :param task_cls: the class of this app's tasks (a :class:`Task` subclass, or its
        ``"module:Class"`` name, imported when the first task is defined), as in Celery.
    """

    def __init__(
        self,
        main: str | None = None,
        *,
        broker: str | None = None,
        backend: str | None = None,
        config_source: Any = None,
        namespace: str | None = None,
        task_cls: type[_Task] | str | None = None,
        **settings: Any,
    ) -> None:
        self.main = main
        self.tasks: dict[str, _Task] = {}
        if task_cls is not None and not isinstance(task_cls, str):
            _task_class("task_cls", task_cls)
        self._task_cls: type[_Task] | str = task_cls or _Task
        explicit = dict(settings)
        if broker is not None:
            explicit["broker_url"] = broker
        if backend is not None:
            explicit["result_backend"] = backend
        check_names(explicit)
        self._config_object: dict[str, Any] = from_object(config_source, namespace) if config_source else {}
        self._explicit = explicit
        self._overrides: dict[str, Any] = {}
        self.settings: Settings = settings_from(self._config_object, self._explicit)
        self.conf = Config(self)
        self._plugins: PluginManager | None = None
        #: hooks registered by app code (``register_hooks``, ``@app.hook``), by name
        self._hook_plugins: dict[str, object] = {}
        self._backend: ResultBackend | None = None
        self._backend_pid = 0
        #: whether the backend replies to the sender (rpc://): decided on first use
        self._replies: bool | None = None
        self._group_result: type[_GroupResult] | None = None
        self._local = threading.local()
        self._signer: SignedSerializer | None = None
        self._signed_body_serializer = "json"
        self._routing: tuple[Settings, Topology, Router] | None = None
        self._transport: Transport | None = None
        _track_for_fork(self)

    # -- settings ----------------------------------------------------------------------------

    def _set(self, changes: dict[str, Any]) -> None:
        check_names(changes)
        overrides = dict(self._overrides, **changes)
        self.settings = settings_from(self._config_object, self._explicit, overrides=overrides)
        self._overrides = overrides
        self._reset_connections()

    def config_from_object(self, source: Any, namespace: str | None = None) -> None:
        """Take settings from a mapping, module or object (replacing a previous config object)."""
        found = from_object(source, namespace)
        self.settings = settings_from(found, self._explicit, overrides=self._overrides)
        self._config_object = found
        self._reset_connections()

    @property
    def broker_urls(self) -> tuple[str, ...]:
        return broker_urls(self.settings)

    @property
    def transport(self) -> Transport:
        """The transport plugin object of the first broker URL (the one this app's connections
        are made through): what the app asks about the broker's capabilities."""
        transport = self._transport
        if transport is None:
            transport = self._transport = transport_for(self.plugins, self.broker_urls[0], self.settings)
        return transport

    @property
    def plugins(self) -> PluginManager:
        """Slot implementations (transports, result backends) this app loads by name."""
        if self._plugins is None:
            self._plugins = PluginManager(autoload=False)
        return self._plugins

    # -- tasks -------------------------------------------------------------------------------

    @property
    def Task(self) -> type[_Task]:
        """The class of this app's tasks (``task_cls``): subclass it for a base of your own."""
        if isinstance(self._task_cls, str):
            self._task_cls = _task_class("task_cls", _import_class(self._task_cls))
        return self._task_cls

    @overload
    def task(self, fun: Callable[..., Any]) -> _Task: ...

    @overload
    def task(self, **options: Any) -> Callable[[Callable[..., Any]], _Task]: ...

    def task(self, fun: Callable[..., Any] | None = None, **options: Any) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(name=..., bind=True, ...)``."""
        if fun is not None:
            if options or not callable(fun):
                raise ConfigurationError(
                    "@app.task takes its options as keywords, for example @app.task(name='proj.add')"
                )
            return self._register(fun)
        return lambda function: self._register(function, **options)

    def _register(self, fun: Callable[..., Any], **options: Any) -> _Task:
        if not callable(fun):
            raise ConfigurationError(f"@app.task needs a function (got {fun!r})")
        name = options.pop("name", None)
        if name is None:
            name = self._task_name(fun)
        elif not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ConfigurationError(
                f"@app.task for {self._task_name(fun)!r}: name must be a non-empty string without "
                f"surrounding spaces (got {name!r}), for example @app.task(name='proj.add'); leave it "
                f"out to use {self._task_name(fun)!r}"
            )
        base = options.pop("base", None)
        try:
            cls = self.Task if base is None else _task_class("base", base)
        except ConfigurationError as exc:
            raise ConfigurationError(f"@app.task for {name!r}: {exc}") from None
        try:
            task = cls()
        except Exception as exc:
            raise ConfigurationError(f"@app.task for {name!r}: its class {_qualified(cls)} could not be "
                                     f"made: {type(exc).__name__}: {exc}") from None
        task.setup_for(self, name, fun, options)
        return self._add(task)

    def register_task(self, task: _Task | type[_Task], **options: Any) -> _Task:
        """Register a class-based task, as Celery's ``app.register_task``: a :class:`Task`
        subclass (or an instance of one) whose ``run`` is the task's body, named by its ``name``
        attribute (else ``module.ClassName``); ``options`` are those of ``@app.task``."""
        if isinstance(task, type):
            cls = _task_class("register_task", task)
            try:
                task = cls()
            except Exception as exc:
                raise ConfigurationError(f"register_task: {_qualified(cls)} could not be made: "
                                         f"{type(exc).__name__}: {exc}") from None
        elif not isinstance(task, _Task):
            raise ConfigurationError(f"register_task needs a subclass of worker_core.Task or an instance of "
                                     f"one (got {task!r} that is a {type(task).__name__})")
        name = options.pop("name", None) or task.name or self._task_name(type(task))
        if not isinstance(name, str) or name != name.strip():
            raise ConfigurationError(f"register_task: the name of {_qualified(type(task))} must be a "
                                     f"non-empty string without surrounding spaces (got {name!r})")
        if self.tasks.get(name) is task:
            return task  # registered already
        task.setup_for(self, name, None, options)
        return self._add(task)

    def _add(self, task: _Task) -> _Task:
        name = task.name
        existing = self.tasks.get(name)
        if existing is not None and existing is not task and _origin(existing) != _origin(task):
            module, qualname = _origin(existing)
            raise ConfigurationError(
                f"task name {name!r} is already registered by {module}.{qualname}; give one of them "
                f"another name with @app.task(name=...)"
            )
        self.tasks[name] = task
        return task

    def _task_name(self, fun: Callable[..., Any] | type) -> str:
        module = fun.__module__
        if module == "__main__" and self.main:
            module = self.main
        return f"{module}.{fun.__name__}"

    def get_task(self, name: str) -> _Task:
        try:
            return self.tasks[name]
        except KeyError:
            raise NotRegistered(f"task {name!r} is not registered.{did_you_mean(name, self.tasks)}") from None

    # -- results ---------------------------------------------------------------------------------

    def result_url(self) -> str:
        """The result backend URL in use: the setting, else the transport's own, else disabled."""
        configured = self.settings.result_backend
        if configured:
            return configured
        transport = self.plugins.slot("transport", scheme_of(self.broker_urls[0]))
        return default_result_url(transport, self.broker_urls[0])

    @property
    def backend(self) -> ResultBackend:
        """This process's result backend (created on first use, again after a fork)."""
        pid = os.getpid()
        if self._backend is None or self._backend_pid != pid:
            url = self.result_url()
            backend_cls = self.plugins.slot("result_backend", scheme_of(url))
            self._backend = backend_cls(url, self.settings)
            self._backend_pid = pid
        return self._backend

    def AsyncResult(self, task_id: str) -> AsyncResult:
        return AsyncResult(task_id, self)

    @property
    def GroupResult(self) -> type[_GroupResult]:
        """The GroupResult class bound to this app: ``app.GroupResult(group_id, results)``,
        ``app.GroupResult.restore(group_id)``."""
        bound = self._group_result
        if bound is None:
            bound = self._group_result = type("GroupResult", (GroupResult,), {"bound_app": self})
        return bound

    # -- canvas ----------------------------------------------------------------------------------

    def signature(self, task: Any, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                  options: Mapping[str, Any] | None = None, **more: Any) -> Signature:
        """A signature of the task named ``task`` (it need not be registered here), or one
        rebuilt from a signature's dict, sending with this app: ``app.signature("proj.add",
        (2, 2), countdown=10)``."""
        if isinstance(task, Mapping):
            copy: Signature = maybe_signature(task, app=self, clone=True)
            return copy
        return Signature(task, args, kwargs, options, app=self, **more)

    @property
    def thread_oid(self) -> str:
        """This thread's id as a client of this app, as Celery names its clients: the
        ``reply_to`` of the tasks it freezes, and of every task it sends when its result backend
        replies to the sender (``rpc://``: then it names the queue this thread's results come
        back on)."""
        state = self._local
        oid: str | None = getattr(state, "oid", None)
        if oid is None:
            if self.replies_to_sender():
                backend = self.backend
                assert isinstance(backend, RepliesToSender)
                oid = backend.reply_to()
            else:
                oid = str(uuid.uuid4())
            state.oid = oid
        return oid

    def replies_to_sender(self) -> bool:
        """Whether the result backend sends results to the client named in each task's
        ``reply_to`` (:class:`~worker_core.slots.RepliesToSender`), decided once per settings."""
        replies = self._replies
        if replies is None:
            try:
                backend_class = self.plugins.slot("result_backend", scheme_of(self.result_url()))
            except PluginError:
                replies = False  # reading a result raises what is wrong with the backend
            else:
                replies = isinstance(backend_class, RepliesToSender)
            self._replies = replies
        return replies

    # -- sending ---------------------------------------------------------------------------------

    def _routing_for(self) -> tuple[Settings, Topology, Router]:
        settings = self.settings
        routing = self._routing
        if routing is None or routing[0] is not settings:
            topology = Topology.from_settings(settings)
            routing = self._routing = (settings, topology, Router(settings.task_routes, topology))
        return routing

    @property
    def topology(self) -> Topology:
        """The queues this app knows (``task_queues``), and how it makes the others."""
        return self._routing_for()[1]

    def route(self, name: str, queue: str | None = None, exchange: str | None = None,
              routing_key: str | None = None, args: Any = None, kwargs: Any = None,
              options: Mapping[str, Any] | None = None) -> Destination:
        """Where a message of the task ``name`` goes (``task_routes``, the caller's ``queue``,
        ``exchange`` and ``routing_key``, the default queue), as Celery's router decides."""
        return self._routing_for()[2].route(name, queue, exchange, routing_key, args, kwargs, options)

    async def asend_task(self, name: str, args: Sequence[Any] | None = None,
                         kwargs: Mapping[str, Any] | None = None, **options: Any) -> _AsyncResult:
        """:meth:`send_task` from async code, without blocking the event loop (the send runs in
        the app's sending thread): ``result = await app.asend_task("proj.add", (2, 3))``."""
        return await client_of(self).call(self.send_task, name, args, kwargs, **options)

    def send_task(
        self,
        name: str,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: datetime | str | None = None,
        expires: float | datetime | str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        task_id: str | None = None,
        retries: int = 0,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        ignore_result: bool | None = None,
        root_id: str | None = None,
        parent_id: str | None = None,
        group_id: str | None = None,
        serializer: str | None = None,
        shadow: str | None = None,
        producer: Any = None,
        **options: Any,
    ) -> _AsyncResult:
        """Send a task by name (it need not be registered here) and return its result handle.

        ``producer`` (a ``kombu.Producer``), as in Celery, publishes the message on its own
        channel instead of this thread's connection (a scheduler sending under a lease does); the
        result backend is not asked to watch for the result then (nobody here waits for it), and
        the destination's queue and exchange are declared on that channel each time.

        ``options`` are those of canvas, as Celery's client takes them (see
        :func:`.sending.extra_options`): ``link``/``link_error`` (a signature or a list of them,
        sent with the return value once the task succeeds, with its id if it fails), ``chain``
        (the signatures to run after it, last first), ``chord`` (the body of the chord whose
        header it is part of), ``group_index`` (its place in the group ``group_id``),
        ``headers`` (added to the message's: the worker's task reads them as
        ``self.request.headers``), ``reply_to``, ``route_name`` (route it as that
        task), ``argsrepr``/``kwargsrepr`` (how its arguments are shown), Celery's stamps, and
        the publish's ``retry``/``retry_policy``.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"task name must be a non-empty string (got {name!r})")
        if args is not None and not isinstance(args, (list, tuple)):
            raise TypeError(f"task args must be a list or tuple (got {type(args).__name__})")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"task kwargs must be a mapping (got {type(kwargs).__name__})")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                     or not 0 <= priority <= 255):
            raise ValueError(f"priority must be a whole number from 0 to 255 (got {priority!r})")
        task_id = task_id or str(uuid.uuid4())
        current = current_context()
        in_task = inside = bool(current.id) and not current.called_directly
        if inside:
            parent_id = parent_id or current.id
            root_id = root_id or current.root_id
            if options and options.pop("add_to_parent", True) is False:
                in_task = False
        ignore = self.settings.task_ignore_result if ignore_result is None else ignore_result
        replies = self._replies
        if replies is None:
            replies = self.replies_to_sender()
        if not options:  # a plain task: the hot path, nothing more than it always did
            message = task_message(
                name, task_id, args, kwargs, countdown=countdown, eta=eta, expires=expires,
                retries=retries, time_limit=time_limit, soft_time_limit=soft_time_limit,
                root_id=root_id, parent_id=parent_id, group_id=group_id, shadow=shadow,
                ignore_result=ignore, reply_to=self.thread_oid if replies else None,
            )
            destination = self.route(name, queue, args=args, kwargs=kwargs)
        else:
            exchange, routing_key = options.pop("exchange", None), options.pop("routing_key", None)
            extra = sending.extra_options(self, name, options)
            message = task_message(
                name, task_id, args, kwargs, countdown=countdown, eta=eta, expires=expires,
                retries=retries, time_limit=time_limit, soft_time_limit=soft_time_limit,
                root_id=root_id, parent_id=parent_id, group_id=group_id, shadow=shadow,
                ignore_result=ignore, **extra.message,
            )
            if extra.headers:
                message.headers.update(extra.headers)
            destination = self.route(extra.route_name or name, queue, exchange, routing_key, args, kwargs,
                                     options)
            message.properties.update(extra.publish)  # _publish takes retry and retry_policy
        if not ignore and not inside and producer is None:
            # a client subscribes to the result before sending; a worker sending what follows a
            # task waits for none of it (as Celery's worker, which never joins)
            self.backend.on_task_call(task_id)
        if priority is None:
            priority = destination.priority
            if priority is None:
                priority = self.settings.task_default_priority
        self._publish(name, message.body, destination, serializer or self.settings.task_serializer,
                      message.headers, priority=priority, expiration=message.expiration,
                      delay=countdown if eta is None else message.headers.get("eta"), producer=producer,
                      **message.properties)
        result = AsyncResult(task_id, self)
        if in_task:  # a child of the running task, stored with its result as Celery's worker does
            add_child(result)
        return result

    def _publish(self, name: str, body: Any, destination: Destination, serializer: str,
                 headers: dict[str, Any],
                 retry: bool | None = None, retry_policy: Mapping[str, Any] | None = None,
                 delay: float | str | None = None, producer: Any = None, **properties: Any) -> None:
        state = self._local
        if producer is not None:
            declared, declare = None, list(destination.declare)
        else:
            if getattr(state, "pid", None) != os.getpid() or getattr(state, "connection", None) is None:
                state.connection, state.producer = connect_for_publishing(self)
                state.pid = os.getpid()
                state.declared = set()
            producer = state.producer
            declared = tuple((type(entity).__name__, entity.name) for entity in destination.declare)
            declare = [] if declared in state.declared else list(destination.declare)
        exchange, routing_key = destination.exchange, destination.routing_key
        if delay is not None:
            exchange, routing_key = self._delayed(destination, delay)
        policy = PUBLISH_RETRY_POLICY if retry_policy is None else dict(PUBLISH_RETRY_POLICY, **retry_policy)
        hooks = self.plugins.hooks
        if "before_task_publish" in hooks.implemented:
            hooks.caller("before_task_publish")(name=name, body=body, exchange=exchange,
                                                routing_key=routing_key,
                                                headers=headers, properties=properties, declare=declare,
                                                retry_policy=policy)
        message = body
        kwargs = {k: v for k, v in properties.items() if v is not None}
        if serializer == "json":
            # kombu's JSON, on the C encoder when the values allow it
            kwargs.update(content_type="application/json", content_encoding="utf-8")
            body = json_dumps(body)
        elif serializer == "auth":
            # signed with this app's own key, whichever app last registered kombu's "auth"
            content_type, content_encoding, body = self._signing().dumps(body)
            kwargs.update(content_type=content_type, content_encoding=content_encoding)
        else:
            kwargs["serializer"] = serializer
        publish_retry = self.settings.task_publish_retry if retry is None else retry
        try:
            producer.publish(
                body, exchange=exchange, routing_key=routing_key, delivery_mode=2, headers=headers,
                declare=declare, retry=publish_retry, retry_policy=policy, **kwargs,
            )
        except Exception as exc:
            transport = self.transport
            if not (declare and isinstance(transport, AdoptsQueues) and transport.declaration_differs(exc)):
                raise
            # the queue exists with other arguments (a quorum queue, say): it takes the message
            # as it is (the channel, closed by the refusal, is opened again by the publish)
            producer.publish(
                body, exchange=exchange, routing_key=routing_key, delivery_mode=2, headers=headers,
                retry=publish_retry, retry_policy=policy, **kwargs,
            )
        if declared is not None:
            state.declared.add(declared)
        if "after_task_publish" in hooks.implemented:
            hooks.caller("after_task_publish")(name=name, body=message, exchange=exchange,
                                               routing_key=routing_key,
                                               headers=headers)

    def _delayed(self, destination: Destination, delay: float | str) -> tuple[str, str]:
        """The exchange and routing key of a message whose countdown the broker holds (Celery's
        native delayed delivery, on a transport that ``DelaysOnBroker``): when the app has quorum
        queues and the message goes through an exchange that is not direct; otherwise its own,
        and the worker holds it."""
        queue = destination.queue
        exchange_type = queue.exchange.type if queue is not None and queue.exchange is not None \
            else destination.exchange_type
        plain = (destination.exchange, destination.routing_key)
        if exchange_type == "direct" or not self.topology.uses_quorum():
            return plain
        transport = self.transport
        if not isinstance(transport, DelaysOnBroker):
            return plain
        seconds = delay if isinstance(delay, (int, float)) else _seconds_until(delay)
        if seconds is None or seconds < 1:
            return plain
        routing_key = destination.routing_key
        if queue is not None and queue.routing_key:
            routing_key = queue.routing_key
        return transport.delayed_route(seconds, routing_key)

    # -- hooks of app code ---------------------------------------------------------------------------

    def register_hooks(self, plugin: object, name: str | None = None) -> str:
        """Implement hooks (:mod:`worker_core.hookspecs`) from app code, as Celery users connect
        signals: ``plugin`` is a module or object whose functions are marked ``@hookimpl``. They
        run in this process (the publish hooks) and in every worker of this app (the others).
        Returns the name they are registered under (``app:<module or class>`` by default).
        """
        if name is None:
            name = f"app:{getattr(plugin, '__name__', None) or type(plugin).__qualname__}"
        self.plugins.register(plugin, name)
        self._hook_plugins[name] = plugin
        return name

    def unregister_hooks(self, name: str) -> None:
        """Take out the hooks registered under ``name``."""
        self._hook_plugins.pop(name, None)
        self.plugins.unregister(name)

    def hook(self, function: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Implement one hook with one function named after it: ``@app.hook`` or
        ``@app.hook(tryfirst=True)`` above ``def task_prerun(task_id, task): ...``."""
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            marked = hookimpl(**options)(fn)
            self.register_hooks(types.SimpleNamespace(**{fn.__name__: marked}),
                                name=f"app:{fn.__module__}.{fn.__qualname__}")
            return fn

        return register(function) if function is not None else register

    def use_plugins(self, plugins: PluginManager) -> None:
        """Use ``plugins`` (a worker's: the installed plugins) from now on, with the hooks
        registered on this app added to it."""
        for name, plugin in self._hook_plugins.items():
            if not plugins.has_plugin(name):
                plugins.register(plugin, name)
        self._plugins = plugins

    # -- signing -----------------------------------------------------------------------------------

    def setup_security(self, allowed_serializers: Sequence[str] | None = None, key: str | None = None,
                       key_password: str | None = None, cert: str | None = None, store: str | None = None,
                       digest: str | None = None, serializer: str | None = None) -> None:
        """Set up signed messages (Celery's name and arguments): ``key``, ``key_password``,
        ``cert``, ``store`` and ``digest`` replace the ``security_*`` settings when given,
        ``serializer`` is the signed body's (json). The files are read and checked now and the
        ``auth`` serializer is registered with kombu (one per process, as in Celery);
        ``allowed_serializers``, when given, disables kombu's other decoders as Celery does.

        :raise ConfigurationError: a setting is missing, or a file cannot be read or used.
        """
        given = {"security_key": key, "security_key_password": key_password, "security_certificate": cert,
                 "security_cert_store": store, "security_digest": digest}
        changes = {name: value for name, value in given.items() if value is not None}
        if changes:
            self.conf.update(changes)
        if serializer is not None:
            self._signed_body_serializer = serializer
        if allowed_serializers is not None:  # before "auth" is registered, as in Celery
            from kombu.serialization import disable_insecure_serializers

            disable_insecure_serializers(list(allowed_serializers))
        self._signer = signing.setup(self.settings, [task.serializer for task in self.tasks.values()],
                                     inner=self._signed_body_serializer)

    def _signing(self) -> SignedSerializer:
        if self._signer is None or self._signer.key is None:
            self._signer = signing.setup(self.settings, ["auth"], inner=self._signed_body_serializer)
        return self._signer

    def _reset_connections(self) -> None:
        state = self._local
        connection = getattr(state, "connection", None)
        if connection is not None and getattr(state, "pid", None) == os.getpid():
            try:
                connection.release()
            except Exception:
                pass
        backend = self._backend
        if backend is not None and self._backend_pid == os.getpid():
            # its connections go now, not when garbage is collected: an rpc:// client's reply
            # queue is deleted with its connection, so workers stop sending to it
            try:
                backend.close()
            except Exception:
                pass
        self._local = threading.local()
        self._backend = None
        self._replies = None
        self._transport = None
        self._signer = None  # the settings may name other files now

    def close(self) -> None:
        """Release this thread's broker connection and the result backend (and the threads of
        the async client, :meth:`asend_task`)."""
        close_client(self)
        self._reset_connections()

    def __repr__(self) -> str:
        return f"<App {self.main or '__main__'}: {len(self.tasks)} tasks>"

    @classmethod
    def load(cls, spec: str, plugins: PluginManager | None = None) -> App:
        """The app ``spec`` names, as ``-A`` takes it (``module``, ``module.sub`` or
        ``module:attribute``), imported with the current directory on the path; an app of
        another framework (a ``celery.Celery`` app) is adapted by the installed app loader that
        takes it (``worker-celery``). Its signing is set up when its settings sign messages.
        For a plugin's command that sends or reads through the app the user names.

        :raise ConfigurationError: the module or the app cannot be found or adapted, saying why.
        """
        from .loader import load_app  # the loader finds Apps in modules: it imports this one

        app = load_app(spec, plugins if plugins is not None else PluginManager())
        serializers = [task.serializer for task in app.tasks.values()]
        if signing.is_used(app.settings, serializers):
            app.setup_security()
        return app


def _import_class(spec: str) -> Any:
    from kombu.utils.imports import symbol_by_name

    try:
        return symbol_by_name(spec)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(f"task_cls {spec!r} cannot be imported ({type(exc).__name__}: {exc}); name "
                                 f"a subclass of worker_core.Task as 'module:Class'") from None


def _task_class(what: str, cls: Any) -> type[Task]:
    if isinstance(cls, type) and issubclass(cls, Task):
        return cls
    raise ConfigurationError(f"{what} must be a subclass of worker_core.Task (got {cls!r} that is a "
                             f"{type(cls).__name__})")


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _origin(task: Task) -> tuple[str, str]:
    """Where a task's body comes from: registering it again from there is no conflict (a
    module imported twice)."""
    body = task.fun
    return getattr(body, "__module__", "?"), getattr(body, "__qualname__", repr(body))


_apps: weakref.WeakSet[App] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Connections and backend clients belong to the parent; a child opens its own on first use.
    for app in list(_apps):
        app._local = threading.local()
        app._backend = None


_fork_hook: list[bool] = []


def _track_for_fork(app: App) -> None:
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook.append(True)
    _apps.add(app)


def _seconds_until(eta: str) -> float | None:
    """Seconds from now to an ISO 8601 ``eta`` (None when it cannot be read)."""
    try:
        when = parse_iso(eta)
    except (TypeError, ValueError):
        return None
    return (when - datetime.now(when.tzinfo)).total_seconds()


if TYPE_CHECKING:
    # mypy proves an App is what canvas sends with.
    from ..canvas.interface import CanvasApp

    _CANVAS_APP: type[CanvasApp] = App

"""What the commands share: ``-p no:NAME`` handling, the plugin manager, and the worker options.

One module: what every command shares, so each command module stays a page.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from .. import signing
from ..app.base import App
from ..app.loader import load_app
from ..app.queues import Topology
from ..app.settings import OTHER_VARIABLES, Settings, check_environment, check_serializers, settings_from
from ..consumer.connect import Connector
from ..exceptions import ConfigurationError, WorkerError
from ..nodenames import node_format
from ..options import (
    OptionSpec,
    WorkerOptions,
    did_you_mean,
    parse_brokers,
    parse_hostname,
    parse_queues,
    scheme_of,
)
from ..plugins.manager import PluginManager
from ..selection import Selection
from ..slots import ForeignApp
from .celery_options import (
    SCHEDULING_NAMES,
    check_disable_prefetch,
    check_pool,
    check_start_method,
    exclude_queues,
    parse_concurrency,
    parse_worker_autoscale,
    placeholders,
)
from .globals import global_options
from .plugin_options import DeclaredOption, resolve_plugin_options

__all__ = [
    "PluginCommand",
    "blocked_from_args",
    "check_endpoints",
    "fail",
    "options_from_params",
    "plugin_option",
    "plugin_values",
    "prepare_app",
    "use_broker",
    "warn_failures",
    "with_worker_options",
    "worker_option_decorators",
]

F = TypeVar("F", bound=Callable[..., Any])

DISABLE_ENV = "WORKER_DISABLE_PLUGINS"


def fail(exc: WorkerError) -> click.ClickException:
    """Turn a project error into a one-line command-line error (no traceback), exit status 2."""
    error = click.ClickException(str(exc))
    error.exit_code = 2  # type: ignore[misc]  # click types it as a ClassVar; set per instance on purpose
    return error


def _blocked_value(value: str) -> str:
    if not value.startswith("no:") or not value[3:].strip():
        raise click.UsageError(
            f"-p takes no:NAME to block a plugin (got {value!r}); for example -p no:prefork. "
            f"Plugins are enabled by installing their distribution."
        )
    return value[3:].strip()


def blocked_from_args(args: Sequence[str]) -> dict[str, str]:
    """Read every ``-p no:NAME`` from raw arguments (before parsing, so blocked plugins are never
    imported, not even to add their options), plus ``WORKER_DISABLE_PLUGINS=a,b``: each name
    with where it was blocked."""
    variable = os.environ.get(DISABLE_ENV, "")
    blocked = {n.strip(): f"{DISABLE_ENV}={variable}" for n in variable.split(",") if n.strip()}
    position = 0
    while position < len(args):
        arg = args[position]
        value = None
        if arg == "--":
            break
        if arg in ("-p", "--plugin") and position + 1 < len(args):
            value = args[position + 1]
            position += 1
        elif arg.startswith("--plugin="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-p") and not arg.startswith("--") and len(arg) > 2:
            value = arg[2:]
        position += 1
        if value is not None:
            name = _blocked_value(value)
            blocked[name] = f"-p no:{name}"
    return blocked


plugin_option = click.option(
    "-p",
    "--plugin",
    "plugin_switches",
    multiple=True,
    metavar="no:NAME",
    help="Block a plugin by name (repeatable). Also WORKER_DISABLE_PLUGINS=a,b.",
)


class PluginCommand(click.Command):
    """A command that loads plugins before parsing, so plugin-declared options exist.

    ``ctx.obj`` holds the :class:`PluginManager` once arguments are parsed.
    """

    #: whether plugin-declared worker options are added to this command
    takes_plugin_options = True

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            manager = PluginManager(blocked_from_args(args))
        except WorkerError as exc:
            raise fail(exc) from None
        ctx.obj = manager
        if self.takes_plugin_options:
            self._add_plugin_options(manager)
        return super().parse_args(ctx, args)

    @property
    def core_params(self) -> list[click.Parameter]:
        """The command's own parameters, without the options the last invocation's plugins added."""
        if not hasattr(self, "_core_params"):
            self._core_params = list(self.params)
        return self._core_params

    def _add_plugin_options(self, manager: PluginManager) -> None:
        # The command object outlives one invocation (tests invoke it many times): start from
        # the core parameters each time.
        self.params = list(self.core_params)
        self.plugin_options.clear()
        taken = {opt for param in self.params for opt in getattr(param, "opts", ())}
        names = {param.name for param in self.params}
        for specs, provider in manager.collect("worker_options"):
            for spec in specs or ():
                if not isinstance(spec, OptionSpec):
                    raise fail(
                        ConfigurationError(
                            f"plugin {provider} returned {spec!r} from worker_options; "
                            f"it must return OptionSpec instances"
                        )
                    )
                clash = [flag for flag in spec.flags if flag in taken]
                if clash or spec.name in names:
                    raise fail(
                        ConfigurationError(
                            f"plugin {provider} declares option {', '.join(clash) or spec.name!r}, "
                            f"which another plugin or the core already has; rename it"
                        )
                    )
                self.params.append(_click_option(spec))
                taken.update(spec.flags)
                names.add(spec.name)
                self.plugin_options[spec.name] = DeclaredOption(spec, provider)
        self.params.extend(placeholders(taken, manager))

    @property
    def plugin_options(self) -> dict[str, DeclaredOption]:
        """The options plugins added to this command, by name."""
        if not hasattr(self, "_plugin_options"):
            self._plugin_options: dict[str, DeclaredOption] = {}
        return self._plugin_options


def _click_option(spec: OptionSpec) -> click.Option:
    def convert(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if param.name is None or ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            return None  # not given here: the environment, the settings or the default decide
        if spec.is_flag:
            return value
        try:
            return spec.convert(value)
        except (ValueError, TypeError) as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return click.Option(
        [*spec.flags, spec.name],  # the bare name is where click puts the value
        is_flag=spec.is_flag,
        default=None,
        help=spec.help,
        callback=convert,
        expose_value=True,
    )


def worker_option_decorators() -> list[Callable[[F], F]]:
    """The options ``workerctl worker`` and ``workerctl steps`` share: every option of Celery's
    ``celery worker`` (with the global ones), and this worker's own."""
    return [
        click.option("-A", "--app", help="Tasks module: module or module:attribute."),
        click.option("-P", "--pool", help="Pool by name: prefork, threads, solo, or a plugin's."),
        click.option("-c", "--concurrency", metavar="N|auto",
                     help="Pool size (default: CPU count; 1 for solo); auto: the CPUs this process may use."),
        click.option("--loop", help="Event loop: auto (default), async or sync."),
        click.option(
            "-b", "--broker", "brokers", multiple=True,
            help="Broker URL; repeat or separate with ';' for failover (default: embedded://).",
        ),
        click.option("--failover", help="Failover strategy between broker URLs (default: round-robin)."),
        click.option("-Q", "--queues", multiple=True,
                     help="Queues to consume, comma-separated (default: every queue of task_queues, "
                          "else task_default_queue, celery)."),
        click.option("-X", "--exclude-queues", multiple=True, help="Queues not to consume, comma-separated."),
        click.option("-I", "--include", multiple=True,
                     help="Modules to import (their tasks) before the worker starts, comma-separated."),
        click.option("--purge", "--discard", "purge", is_flag=True, default=None,
                     help="Delete the messages waiting in the consumed queues at start."),
        click.option("--prefetch-multiplier", type=int, help="Messages reserved per process (default: 4)."),
        click.option("--disable-prefetch", is_flag=True, default=None,
                     help="Refused, with its equivalent: --prefetch-multiplier 1 and acks_late tasks."),
        click.option("--autoscale", metavar="MAX[,MIN]",
                     help="Grow and shrink the pool between MIN and MAX."),
        click.option("--autoscaler", help="Autoscaler by name (default: default)."),
        click.option("-l", "--loglevel", help="DEBUG, INFO, WARNING (default), ERROR or CRITICAL (FATAL)."),
        click.option("-n", "--hostname",
                     help="Node name, as Celery's: w1@%h (%h host, %n its first label, %d its domain); "
                          "default celery@<host>."),
        click.option("--time-limit", type=float, help="Hard time limit per task, in seconds."),
        click.option("--soft-time-limit", type=float, help="Soft time limit per task, in seconds."),
        click.option("--max-tasks-per-child", type=int, help="Replace a pool process after N tasks."),
        click.option("--max-memory-per-child", type=int, help="Replace a pool process above N KiB resident."),
        click.option("--pool-start-method", type=click.Choice(["fork", "spawn"]),
                     help="How prefork children start: fork (the only one here)."),
        click.option("-S", "--statedb",
                     help="File that keeps the revoked task ids and the logical clock across restarts "
                          "(%n, %h, %i expanded)."),
        click.option("-O", "--optimization", "scheduling", metavar="fair|fcfs",
                     help="Dispatch to idle processes only (fair, default; Celery's default) or any (fcfs)."),
        click.option("--without-gossip", is_flag=True, default=None,
                     help="Accepted, as Celery's: this worker gossips with no other worker."),
        click.option("--without-mingle", is_flag=True, default=None,
                     help="Accepted, as Celery's: this worker does not mingle at start."),
        click.option("-D", "--detach", is_flag=True, default=None, help="Run in the background (a daemon)."),
        click.option("-f", "--logfile", help="Log to this file (%n, %h, %i, %I expanded); default stderr."),
        click.option("--pidfile", help="Write the worker's pid to this file (%n expanded); refuse to start "
                                       "while a running process holds it."),
        click.option("--uid", help="Drop privileges to this user (name or id)."),
        click.option("--gid", help="Drop privileges to this group (name or id)."),
        click.option("--umask", help="umask of the detached worker (octal with a leading 0)."),
        click.option("--executable", help="Python executable of the detached worker."),
        *global_options(),
        plugin_option,
    ]


def with_worker_options(func: F) -> F:
    for decorator in reversed(worker_option_decorators()):
        func = decorator(func)
    return func


def options_from_params(
    params: Mapping[str, Any],
    manager: PluginManager,
    *,
    plugin_values: Mapping[str, Any] | None = None,
    defaults: WorkerOptions | None = None,
) -> WorkerOptions:
    """Build :class:`WorkerOptions` from parsed command-line values over ``defaults``.

    :param plugin_values: the values of the options plugins declared (see :func:`plugin_values`);
        they go to ``extra``.
    """
    base = defaults or WorkerOptions()
    changes: dict[str, Any] = {}
    simple = (
        "app", "failover", "prefetch_multiplier", "autoscaler", "time_limit", "soft_time_limit",
        "max_tasks_per_child", "max_memory_per_child", "statedb", "logfile", "pidfile", "purge",
    )
    for name in simple:
        if params.get(name) is not None:
            changes[name] = params[name]
    if params.get("loop") is not None:
        changes["loop"] = params["loop"]
    if params.get("pool") is not None:
        changes["pool"] = check_pool(params["pool"], manager)
    if params.get("concurrency") is not None:
        concurrency = parse_concurrency(params["concurrency"])
        if concurrency is not None:
            changes["concurrency"] = concurrency
    if params.get("scheduling") is not None:
        changes["scheduling"] = SCHEDULING_NAMES.get(params["scheduling"], params["scheduling"])
    check_start_method(params.get("pool_start_method"))
    check_disable_prefetch(params.get("disable_prefetch"))
    if params.get("hostname") is not None:
        changes["hostname"] = parse_hostname(params["hostname"])
    if params.get("loglevel") is not None:
        level = str(params["loglevel"]).upper()
        changes["loglevel"] = "CRITICAL" if level == "FATAL" else level
    if params.get("brokers"):
        changes["brokers"] = parse_brokers(params["brokers"])
        if not changes["brokers"]:
            raise ConfigurationError(
                f"-b/--broker needs a URL (got {';'.join(params['brokers'])!r}), for example "
                f"-b redis://127.0.0.1:6379/0"
            )
    if params.get("queues"):
        changes["queues"] = parse_queues(params["queues"])
    if params.get("exclude_queues"):
        changes["queues"] = exclude_queues(changes.get("queues", base.queues), params["exclude_queues"])
    if params.get("autoscale"):
        changes["autoscale"] = parse_worker_autoscale(params["autoscale"])
    hostname = changes.get("hostname", base.hostname)
    for name, flag in (("statedb", "--statedb"), ("pidfile", "--pidfile")):
        path = changes.get(name, getattr(base, name))
        if path:
            changes[name] = node_format(path, hostname, what=flag)
    loop = changes.get("loop")
    if loop is not None:
        choices = ["auto", *manager.names("loop")]
        if loop not in choices:
            raise ConfigurationError(
                f"--loop must be one of {', '.join(choices)} (got {loop!r}).{did_you_mean(loop, choices)}"
            )
    changes["extra"] = {**base.extra, **(plugin_values or {})}
    changes["blocked_plugins"] = tuple(sorted(manager.blocked))
    return base.replace(**changes)


def warn_failures(manager: PluginManager) -> None:
    """Print one line per plugin that failed to load but that this command does not need."""
    for line in manager.failures():
        click.echo(f"warning: {line}; skipped", err=True)


def plugin_values(command: PluginCommand, params: Mapping[str, Any], manager: PluginManager,
                  settings: Any = None) -> dict[str, Any]:
    """The value of every option plugins declared on ``command``: ``params`` (the command line)
    over ``WORKER_<OPTION_NAME>`` over ``settings.worker_plugin_options`` (settings from the
    environment alone without an app) over each option's default."""
    for name, option in command.plugin_options.items():
        if name.lower() in Settings.names() or option.variable in OTHER_VARIABLES:
            raise ConfigurationError(
                f"plugin {option.provider} declares option {name!r}, whose variable {option.variable} "
                f"the core reads already; rename the option"
            )
    if settings is None:
        settings = settings_from()

    def unavailable() -> list[str]:
        absent = ("blocked", "failed", "conflict")
        return sorted({status.entry.name for status in manager.statuses()
                       if status.entry.kind == "hooks" and status.status in absent})

    return resolve_plugin_options(command.plugin_options, params, settings.worker_plugin_options,
                                  unavailable=unavailable)


def declared_option_names(manager: PluginManager) -> set[str]:
    """The names of the options the loaded plugins declare, lower-cased as variables read them."""
    return {spec.name.lower() for specs, _ in manager.collect("worker_options") for spec in specs or ()
            if isinstance(spec, OptionSpec)}


def prepare_app(
    spec: str, plugin_options: Collection[str] | Callable[[], Collection[str]] = (),
    plugins: PluginManager | None = None, configure: Callable[[Any], None] | None = None,
) -> tuple[Any, WorkerOptions]:
    """Load the app named by ``-A`` and the worker defaults its settings give.

    ``WORKER_*`` variables are checked first, so a bad one is named as such rather than as a
    failed import (``plugin_options`` names the options plugins declare, whose variables are
    theirs: see ``check_environment``; ``plugins`` holds the app loaders asked when ``spec``
    names no App); the serializers are checked once the module (and whatever it registers) is
    in, the ``auth`` serializer among them when the settings sign or verify messages. An app an
    app loader adapted (a :class:`~worker_core.slots.ForeignApp`) adds what its own
    configuration says to the defaults. ``configure(app)`` changes the app's settings first
    (the command line's ``--config``, ``--result-backend``, ``-b``).
    """
    check_environment(plugin_options=plugin_options)
    app = load_app(spec, plugins)
    if configure is not None:
        configure(app)
    settings = app.settings
    task_serializers = {name: task.serializer for name, task in app.tasks.items()}
    if signing.is_used(settings, task_serializers.values()):
        app.setup_security()
    check_serializers(settings, task_serializers,
                      {name: task.result_serializer for name, task in app.tasks.items()})
    defaults = WorkerOptions(
        app=spec,
        pool=settings.worker_pool,
        concurrency=settings.worker_concurrency,
        prefetch_multiplier=settings.worker_prefetch_multiplier,
        max_tasks_per_child=settings.worker_max_tasks_per_child,
        max_memory_per_child=settings.worker_max_memory_per_child,
        statedb=settings.worker_state_db,
        remote_control=settings.worker_enable_remote_control,
        failover=settings.broker_failover_strategy,
        # without -Q, every queue of task_queues, as Celery's worker consumes them
        queues=tuple(Topology.from_settings(settings).queues) if settings.task_queues
        else (settings.task_default_queue,),
    )
    if isinstance(app, ForeignApp):  # an app loader's: its own configuration says more
        defaults = app.worker_defaults(defaults)
    return app, defaults


def use_broker(app: Any, url: str) -> None:
    """Make ``url`` (from ``-b``) the app's broker over its settings and ``WORKER_BROKER_URL``,
    so tasks that publish from the worker (retries) and the default result backend follow the
    command line too."""
    app.conf.update(broker_url=url)


def client_app(app_spec: str | None, broker: str | None) -> Any:
    """The app a client command sends through: ``-A`` if given (else one with the defaults and
    ``WORKER_*`` settings), on ``-b`` if given."""
    if app_spec:
        # A client loads no plugins, unless a variable looks like a typo: it may be a plugin's option.
        app, _ = prepare_app(app_spec, lambda: declared_option_names(PluginManager()))
    else:
        app = App()
    if broker:
        use_broker(app, broker)
    return app


def check_endpoints(manager: PluginManager, settings: Any, selection: Selection) -> None:
    """Build (without connecting) the transport of every broker URL, the reconnect schedule and
    the result backend, so a malformed URL or a bad ``broker_transport_options`` is an error
    before anything starts, not a log line once the worker runs."""
    for url in selection.broker_urls:
        manager.slot("transport", scheme_of(url))(url, settings)
    Connector(manager, settings, selection.broker_urls, selection.options.failover,
              should_continue=lambda: False)
    manager.slot("result_backend", scheme_of(selection.result_url))(selection.result_url, settings)

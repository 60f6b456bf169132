"""``workerctl beat``: run a scheduler (as ``celery beat``), list the schedule, and change the entries
kept on the broker (``add``, ``remove``, ``enable``, ``disable``)."""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
from datetime import datetime, timezone
from typing import Any

import click

from worker_core.exceptions import ConfigurationError, WorkerError

__all__ = ["beat"]

LOGLEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "FATAL")


def _fail(exc: Exception) -> click.ClickException:
    error = click.ClickException(str(exc))
    error.exit_code = 2  # type: ignore[misc]  # click types it as a ClassVar; set per instance on purpose
    return error


def _app(ctx: click.Context) -> Any:
    """The app ``-A`` names (here or before the command: ``workerctl -A proj beat``), on ``-b``
    if given; without ``-A``, an app with the settings of ``WORKER_*`` variables."""
    from worker_core import App

    options: dict[str, Any] = ctx.find_object(dict) or {}
    root = ctx.find_root().params
    spec = options.get("app") or root.get("app")
    brokers = options.get("brokers") or root.get("brokers")
    try:
        app = App.load(spec) if spec else App()
        if brokers:
            app.conf.update(broker_url=";".join(brokers))
    except WorkerError as exc:
        raise _fail(exc) from None
    return app


def _setup_logging(level: str | None, app: Any) -> None:
    from worker_core.redaction import install_secret_filter, secrets_of

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel("CRITICAL" if (level or "").upper() == "FATAL" else (level or "INFO").upper())
    names = ("broker_url", "result_backend", "broker_transport_options")
    install_secret_filter([handler], secrets_of({name: getattr(app.settings, name) for name in names}))


@click.group(invoke_without_command=True)
@click.option("-A", "--app",
              help="Tasks module whose settings hold beat_schedule: module or module:attribute.")
@click.option("-b", "--broker", "brokers", multiple=True, help="Broker URL (default: the app's).")
@click.option("-s", "--schedule-filename", "--schedule", "schedule_filename",
              help="Celery's file of the scheduler's state; not used here (the state is kept on the broker).")
@click.option("-S", "--scheduler", help="Where entries come from besides beat_schedule: store (the default "
                                        "where the broker keeps records) or settings.")
@click.option("--max-interval", type=click.FloatRange(min=0, min_open=True),
              help="Most seconds between looks at the schedule (beat_max_loop_interval).")
@click.option("-n", "--hostname", help="This scheduler's name, as others see it (default beat@<host>).")
@click.option("-l", "--loglevel", type=click.Choice(LOGLEVELS, case_sensitive=False),
              help="DEBUG, INFO (default), WARNING, ERROR or CRITICAL.")
@click.option("--list", "show", is_flag=True,
              help="Show each entry's next run and last send, and who sends now.")
@click.option("--json", "as_json", is_flag=True, help="With --list: as one JSON object.")
@click.pass_context
def beat(ctx: click.Context, /, **params: Any) -> None:
    """Run a periodic-task scheduler for the app given with -A (as celery beat), or, with --list,
    show the schedule. Any number may run, on any machines, and workers started with -B too: one
    of them sends each tick, and another takes over within beat_lease_timeout (3 s) plus half a
    second when it stops or is lost.

    Entries come from the app's beat_schedule and from those added with workerctl beat add.
    """
    ctx.ensure_object(dict).update(app=params["app"], brokers=params["brokers"])
    if ctx.invoked_subcommand is not None:
        return
    app = _app(ctx)
    if params["show"]:
        _show(app, params["scheduler"], params["as_json"])
        return
    if params["max_interval"] is not None:
        app.conf.update(beat_max_loop_interval=params["max_interval"])
    _setup_logging(params["loglevel"], app)
    _run(app, params)


def _run(app: Any, params: dict[str, Any]) -> None:
    from .service import BeatService, log_tick

    holder = params["hostname"] or f"beat@{socket.gethostname()}"
    try:
        service = BeatService(app, holder, scheduler=params["scheduler"],
                              schedule_file=params["schedule_filename"], on_tick=log_tick)
    except WorkerError as exc:
        raise _fail(exc) from None
    stopped = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    click.echo(f"workerctl beat: {holder}, {len(service.scheduler.check())} entries, broker "
               f"{type(app.transport).__name__}, ready.")
    service.start()
    try:
        while not stopped.wait(0.5):
            pass
    finally:
        logging.getLogger("worker.beat").warning("beat: Shutting down")
        service.stop()


# -- --list -----------------------------------------------------------------------------------------


def _listing(app: Any, scheduler: str | None) -> dict[str, Any]:
    """Every entry with its next run and last send, and the lease's holder, read from the broker."""
    from worker_core.slots import ElectsLeaders, SendsOnce

    from .entries import Entry
    from .scheduler import _moment
    from .service import LEASE, zone_of
    from .sources import SettingsSource, StoreSource, load_source

    transport = app.transport
    sources: list[Any] = [SettingsSource(app, transport)]
    dynamic = load_source(scheduler if scheduler is not None else app.settings.beat_scheduler, transport)
    if dynamic is not None:
        sources.append(dynamic(app, transport))
    entries: dict[str, Entry] = {}
    disabled: set[str] = set()
    for source in sources:
        for name, entry in source.entries().items():
            entries.setdefault(name, entry)
        if isinstance(source, StoreSource):
            for name, (enabled, _since) in source.overrides().items():
                if not enabled:
                    disabled.add(name)
        source.close()
    holder, records = None, None
    if isinstance(transport, ElectsLeaders):
        lease = transport.lease(LEASE, "beat-list", ttl=app.settings.beat_lease_timeout)
        try:
            state = lease.current()
            if state is not None:
                holder = {"holder": state.holder, "token": state.token, "expires_in": state.expires_in}
            records = lease.records() if isinstance(lease, SendsOnce) else None
        finally:
            lease.close()
    zone = zone_of(app.settings)
    now = datetime.now(timezone.utc)
    shown = []
    for name, entry in sorted(entries.items()):
        record = json.loads(records[name]) if records and name in records else {}
        enabled = entry.enabled and name not in disabled
        last = _moment(record.get("due"))
        try:
            upcoming = entry.schedule.next_after(last or now, zone) if enabled else None
        except Exception as exc:  # a foreign schedule failing: said in the listing
            upcoming, record = None, {**record, "error": f"{type(exc).__name__}: {exc}"}
        shown.append({
            "name": name, "task": entry.task, "schedule": entry.schedule.describe(), "source": entry.source,
            "enabled": enabled, "next_run": upcoming.isoformat() if upcoming else None,
            "last_due": record.get("due") if record.get("sent") else None, "last_sent": record.get("sent"),
            "sent_by": record.get("by"), "error": record.get("error"),
        })
    return {"leader": holder, "state_known": records is not None, "entries": shown}


def _show(app: Any, scheduler: str | None, as_json: bool) -> None:
    try:
        listing = _listing(app, scheduler)
    except WorkerError as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(listing, indent=2))
        return
    leader = listing["leader"]
    if leader is None:
        click.echo("leader: none (no scheduler holds the lease)")
    else:
        left = f", {leader['expires_in']:.1f}s left" if leader["expires_in"] is not None else ""
        token = f"token {leader['token']}" if leader["token"] is not None else "token not shown by the broker"
        who = leader["holder"] or "a scheduler (the broker does not name it)"
        click.echo(f"leader: {who} ({token}{left})")
    if not listing["state_known"]:
        click.echo("last sends: kept by the leader on this broker; ask it: workerctl inspect beat")
    rows = [("entry", "task", "schedule", "next run", "last sent")]
    for entry in listing["entries"]:
        upcoming = entry["next_run"] or ("disabled" if not entry["enabled"] else "-")
        sent = entry["last_sent"] or "-"
        if entry["last_sent"] and entry["sent_by"]:
            sent = f"{sent} by {entry['sent_by']}"
        if entry["error"]:
            sent = f"{sent} (error: {entry['error']})"
        rows.append((entry["name"], entry["task"], entry["schedule"], upcoming, sent))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        click.echo("  ".join([*cells, row[4]]))


# -- changing the stored entries --------------------------------------------------------------------


def _store(ctx: click.Context) -> tuple[Any, Any]:
    from .sources import StoreSource

    app = _app(ctx)
    try:
        return app, StoreSource(app, app.transport)
    except WorkerError as exc:
        raise _fail(exc) from None


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        seconds = float(value) * unit
    except ValueError:
        raise click.BadParameter(f"must be seconds, or a number with s, m, h or d (got {text!r})") from None
    if not seconds > 0:
        raise click.BadParameter(f"must be more than 0 (got {text!r})")
    return seconds


def _json(kind: type, what: str) -> Any:
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise click.BadParameter(f"must be JSON {what} ({exc})") from None
        if not isinstance(parsed, kind):
            raise click.BadParameter(f"must be JSON {what} (got {value!r})")
        return parsed

    return convert


@beat.command()
@click.argument("name")
@click.argument("task")
@click.option("--every", "interval", help="Run every this many seconds (or 30s, 5m, 2h, 1d).")
@click.option("--crontab", help='Run at these times: "minute hour day-of-month month day-of-week", as cron.')
@click.option("--relative", is_flag=True, help="With --every: round each run down to the interval's unit.")
@click.option("--args", callback=_json(list, "list"), help='Positional arguments as JSON: \'[1, "a"]\'.')
@click.option("--kwargs", callback=_json(dict, "object"), help='Keyword arguments as JSON: \'{"n": 1}\'.')
@click.option("--queue", help="The queue to send to (default: the task's route).")
@click.option("--priority", type=click.IntRange(0, 255), help="The message's priority.")
@click.option("--expires", type=click.FloatRange(min=0, min_open=True),
              help="Seconds after each send past which the task is not run.")
@click.option("--options", callback=_json(dict, "object"), help="More apply_async options as JSON.")
@click.option("--skip-missed", is_flag=True, help="Skip runs missed while no scheduler held the lease.")
@click.option("-A", "--app", help="Tasks module (to check the name against beat_schedule).")
@click.option("-b", "--broker", "brokers", multiple=True, help="Broker URL (default: the app's).")
@click.pass_context
def add(ctx: click.Context, /, name: str, task: str, **given: Any) -> None:
    """Add (or replace) the stored entry NAME, which sends TASK; running schedulers take it up
    within beat_max_loop_interval (a second)."""
    _own_app(ctx, given)
    if (given["interval"] is None) == (given["crontab"] is None):
        raise click.UsageError("give one of --every SECONDS and --crontab 'MIN HOUR DOM MON DOW'")
    if given["interval"] is not None:
        schedule: dict[str, Any] = {"every": _seconds(given["interval"])}
        if given["relative"]:
            schedule["relative"] = True
    else:
        schedule = {"crontab": given["crontab"]}
    options = dict(given["options"] or {})
    for key in ("queue", "priority", "expires"):
        if given[key] is not None:
            options[key] = given[key]
    if given["skip_missed"]:
        options["skip_missed"] = True
    app, store = _store(ctx)
    try:
        if name in app.settings.beat_schedule:
            raise ConfigurationError(f"{name!r} is an entry of the app's beat_schedule; choose another name "
                                     f"(or workerctl beat disable {name})")
        store.add(name, {"task": task, "schedule": schedule, "args": given["args"] or [],
                         "kwargs": given["kwargs"] or {}, "options": options, "enabled": True})
    except WorkerError as exc:
        raise _fail(exc) from None
    finally:
        store.close()
    when = f"every {given['interval']}" if given["interval"] else given["crontab"]
    click.echo(f"added {name}: {task}, {when}")


def _own_app(ctx: click.Context, given: dict[str, Any]) -> None:
    options = ctx.ensure_object(dict)
    spec, brokers = given.pop("app", None), given.pop("brokers", ())
    if spec:
        options["app"] = spec
    if brokers:
        options["brokers"] = brokers


def _name_command(action: str, text: str) -> Any:
    @click.argument("name")
    @click.option("-A", "--app",
                  help="Tasks module (its beat_schedule's entries can be enabled and disabled).")
    @click.option("-b", "--broker", "brokers", multiple=True, help="Broker URL (default: the app's).")
    @click.pass_context
    def command(ctx: click.Context, /, name: str, **given: Any) -> None:
        _own_app(ctx, given)
        app, store = _store(ctx)
        in_settings = name in app.settings.beat_schedule
        try:
            if action == "remove":
                if in_settings:
                    raise ConfigurationError(f"{name!r} comes from the app's beat_schedule: remove it there, "
                                             f"or workerctl beat disable {name}")
                done = store.remove(name)
            else:
                done = store.switch(name, action == "enable", in_settings=in_settings)
        except WorkerError as exc:
            raise _fail(exc) from None
        finally:
            store.close()
        if not done:
            raise _fail(ConfigurationError(f"there is no entry {name!r}: workerctl beat --list shows them"))
        click.echo(f"{action}d {name}" if action != "remove" else f"removed {name}")

    command.__doc__ = text
    return beat.command(action)(command)


_name_command("remove", "Remove the stored entry NAME; running schedulers drop it within a second.")
_name_command("enable", "Enable the entry NAME (stored, or of beat_schedule); its runs start from now.")
_name_command("disable", "Disable the entry NAME (stored, or of beat_schedule), without removing it.")

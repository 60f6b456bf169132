"""``workerctl postgres``: create or migrate the tables, and show their state (schema versions,
queue lengths, table sizes and dead rows, the workers' connections), all from SQL."""

from __future__ import annotations

import json
from typing import Any

import click

from worker_core.exceptions import ConfigurationError

__all__ = ["postgres"]

_URL_HELP = "A PostgreSQL URL (postgresql://, or Celery's sqla+postgresql:// and db+postgresql://)."


def _open(url: str) -> Any:
    from .database import connect
    from .options import conninfo_of

    try:
        return connect(conninfo_of(url), role="workerctl")
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    except Exception as exc:
        raise click.ClickException(f"cannot connect to PostgreSQL: {str(exc).strip()}") from None


def _names(schema: str) -> Any:
    from .options import check_schema
    from .schema import Names

    try:
        return Names(check_schema(schema))
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--schema") from None


@click.group()
def postgres() -> None:
    """The PostgreSQL broker's and result backend's tables (worker-transport-postgres)."""


@postgres.command()
@click.argument("url")
@click.option("--schema", default="public", show_default=True, help="The schema of the tables.")
@click.option("--part", "parts", multiple=True, type=click.Choice(["broker", "results"]),
              help="Only these parts (repeat for both; default: both).")
def migrate(url: str, schema: str, parts: tuple[str, ...]) -> None:
    """Create the tables at URL, or bring them to this release's version.

    URL: """
    from .schema import LATEST
    from .schema import migrate as run

    names = _names(schema)
    with _open(url) as connection:
        try:
            before = run(connection, names, parts or ("broker", "results"))
        except ConfigurationError as exc:
            raise click.ClickException(str(exc)) from None
    for part, version in before.items():
        latest = LATEST[part]
        done = "already at" if version == latest else f"migrated from {version} to"
        click.echo(f"{part} tables in schema {schema}: {done} version {latest}")


migrate.help = (migrate.help or "") + _URL_HELP


@postgres.command()
@click.argument("url")
@click.option("--schema", default="public", show_default=True, help="The schema of the tables.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def status(url: str, schema: str, as_json: bool) -> None:
    """Show the schema versions, each queue's ready, delayed and taken messages, the tables' size
    and dead rows, and the connections of workers and clients.

    URL: """
    from .schema import LATEST, versions

    names = _names(schema)
    with _open(url) as connection:
        found = versions(connection, names)
        report: dict[str, Any] = {"schema": schema, "versions": found, "latest": dict(LATEST), "queues": {},
                                  "tables": {}, "connections": {}}
        if found["broker"]:
            rows = connection.execute(
                f"""SELECT q.name,
                        count(m.id) FILTER (WHERE m.visible AND m.not_before IS NULL),
                        count(m.id) FILTER (WHERE m.visible AND m.not_before IS NOT NULL),
                        count(m.id) FILTER (WHERE m.visible IS FALSE)
                    FROM {names.queues} AS q LEFT JOIN {names.messages} AS m ON m.queue_id = q.id
                    GROUP BY q.name ORDER BY q.name""").fetchall()
            report["queues"] = {name: {"ready": ready, "delayed": delayed, "taken": taken}
                                for name, ready, delayed, taken in rows}
        for name, size, live, dead, vacuumed in connection.execute(
                """SELECT c.relname, pg_total_relation_size(c.oid), s.n_live_tup, s.n_dead_tup,
                          greatest(s.last_autovacuum, s.last_vacuum)
                   FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                   LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
                   WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY c.relname""", (schema,)).fetchall():
            report["tables"][name] = {"bytes": size, "live_rows": live, "dead_rows": dead,
                                      "vacuumed": None if vacuumed is None else vacuumed.isoformat()}
        for role, count in connection.execute(
                """SELECT split_part(application_name, ' ', 2), count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND application_name LIKE 'worker %%'
                   GROUP BY 1 ORDER BY 1""").fetchall():
            report["connections"][role] = count
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"schema {schema}: " + ", ".join(
        f"{part} version {version} (this release: {LATEST[part]})" for part, version in found.items()))
    for name, counts in report["queues"].items():
        click.echo(f"  queue {name}: {counts['ready']} ready, {counts['delayed']} delayed, "
                   f"{counts['taken']} taken")
    for name, table in report["tables"].items():
        click.echo(f"  table {name}: {table['bytes']} bytes, {table['live_rows']} live rows, "
                   f"{table['dead_rows']} dead rows")
    click.echo("  connections: " + (", ".join(f"{role} {count}" for role, count in
                                              report["connections"].items()) or "none"))


status.help = (status.help or "") + _URL_HELP

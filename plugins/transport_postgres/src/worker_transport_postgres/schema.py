"""The tables, created and migrated by the plugin, each part with a version recorded in
``<schema>.worker_schema``.

**broker** (version :data:`BROKER_VERSION`): kombu's SQLAlchemy transport's ``kombu_queue`` and
``kombu_message`` (its sequences, columns and constraint names, so a Celery client on
``sqla+postgresql://`` writes into the same queues), with columns of this plugin's added
(priority, ``not_before`` for countdowns and ETAs, ``expires_at``, the delivery count and the
lease), a trigger that fills them for rows kombu writes, and one that notifies the consumers of a
queue (``LISTEN "<schema>.<message table>"``, payload the queue's id); exchanges, bindings and
counters beside them.

**results** (version :data:`RESULTS_VERSION`): Celery's database result backend's
``celery_taskmeta`` and ``celery_tasksetmeta`` (with the extended columns), a trigger notifying
``"<schema>.celery_taskmeta"`` with the task id when a task reaches a ready state, and the chord
counts.

Migrating takes a transaction-level advisory lock per schema and part, so workers starting
together migrate once; each step is idempotent, and tables kombu or Celery created before are
brought up to this layout in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from worker_core.exceptions import ConfigurationError

__all__ = ["BROKER_VERSION", "PARTS", "RESULTS_VERSION", "Names", "migrate", "quote", "versions"]

logger = logging.getLogger(__name__)

BROKER_VERSION = 1
RESULTS_VERSION = 1


def quote(identifier: str) -> str:
    """``identifier`` as a quoted SQL identifier."""
    return '"' + identifier.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class Names:
    """The quoted names of one schema's tables, and its notification channels."""

    def __init__(
        self, schema: str, queue_table: str = "kombu_queue", message_table: str = "kombu_message"
    ) -> None:
        self.schema_name = schema
        self.queue_table, self.message_table = queue_table, message_table
        s = self.schema = quote(schema)
        self.queues = f"{s}.{quote(queue_table)}"
        self.messages = f"{s}.{quote(message_table)}"
        self.exchanges = f"{s}.worker_exchanges"
        self.bindings = f"{s}.worker_bindings"
        self.counters = f"{s}.worker_counters"
        self.versions = f"{s}.worker_schema"
        self.taskmeta = f"{s}.celery_taskmeta"
        self.tasksetmeta = f"{s}.celery_tasksetmeta"
        self.chords = f"{s}.worker_chords"
        self.chord_parts = f"{s}.worker_chord_parts"
        #: the channel a queue's new messages are notified on (payload: the queue's id, with
        #: ``@<epoch>`` for one held until then)
        self.message_channel = f"{schema}.{message_table}"[:63]
        #: the channel a task's ready result is notified on (payload: the task id)
        self.result_channel = f"{schema}.celery_taskmeta"[:63]

    def sequence(self, name: str) -> str:
        return literal(f"{self.schema}.{name}")


def _broker_v1(n: Names) -> str:
    s, q, m = n.schema, n.queues, n.messages
    table = n.message_table
    return f"""
CREATE SEQUENCE IF NOT EXISTS {s}.queue_id_sequence;
CREATE SEQUENCE IF NOT EXISTS {s}.message_id_sequence;
CREATE TABLE IF NOT EXISTS {q} (
    id integer NOT NULL DEFAULT nextval({n.sequence("queue_id_sequence")}) PRIMARY KEY,
    name varchar(200) UNIQUE
);
-- (kombu's SQLAlchemy models name the sequence in each INSERT: a table they made has no default)
ALTER TABLE {q} ALTER COLUMN id SET DEFAULT nextval({n.sequence('queue_id_sequence')});
ALTER TABLE {q}
    ADD COLUMN IF NOT EXISTS message_ttl double precision,
    ADD COLUMN IF NOT EXISTS expires double precision,
    ADD COLUMN IF NOT EXISTS used_at timestamptz NOT NULL DEFAULT now();
CREATE TABLE IF NOT EXISTS {m} (
    id bigint NOT NULL DEFAULT nextval({n.sequence("message_id_sequence")}) PRIMARY KEY,
    visible boolean DEFAULT true,
    "timestamp" timestamp,
    payload text NOT NULL,
    version smallint NOT NULL DEFAULT 1,
    queue_id integer CONSTRAINT "FK_kombu_message_queue" REFERENCES {q} (id)
);
DO $$ BEGIN
    IF (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
        WHERE attrelid = {literal(m)}::regclass AND attname = 'id') = 'integer' THEN
        ALTER TABLE {m} ALTER COLUMN id TYPE bigint;
        ALTER SEQUENCE {s}.message_id_sequence AS bigint;
    END IF;
END $$;
ALTER TABLE {m}
    ALTER COLUMN id SET DEFAULT nextval({n.sequence('message_id_sequence')}),
    ALTER COLUMN version SET DEFAULT 1,
    ALTER COLUMN visible SET DEFAULT true,
    ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS filled boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS not_before timestamptz,
    ADD COLUMN IF NOT EXISTS expires_at timestamptz,
    ADD COLUMN IF NOT EXISTS delivered integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS lease_owner text,
    ADD COLUMN IF NOT EXISTS lease_until timestamptz;
-- finished messages are deleted at once: let autovacuum keep up with a busy queue
ALTER TABLE {m} SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                     autovacuum_analyze_scale_factor = 0.05, fillfactor = 90);
CREATE INDEX IF NOT EXISTS {quote(table + "_ready")} ON {m} (queue_id, priority DESC, id)
    WHERE visible AND not_before IS NULL;
CREATE INDEX IF NOT EXISTS {quote(table + "_delayed")} ON {m} (not_before)
    WHERE visible AND not_before IS NOT NULL;
CREATE INDEX IF NOT EXISTS {quote(table + "_taken")} ON {m} (lease_until) WHERE NOT visible;
CREATE INDEX IF NOT EXISTS {quote(table + "_expiring")} ON {m} (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {quote(table + "_queue")} ON {m} (queue_id);

-- rows kombu writes (a Celery client on sqla+postgresql://) carry only the envelope: read their
-- priority, ETA and expiry from it, as this plugin's own publishes fill them
CREATE OR REPLACE FUNCTION {s}.worker_fill_message() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE
    envelope jsonb;
    ttl double precision;
BEGIN
    BEGIN
        envelope := NEW.payload::jsonb;
    EXCEPTION WHEN others THEN
        NEW.filled := true;
        RETURN NEW;  -- not JSON: delivered as it is, and the worker rejects it saying why
    END;
    BEGIN
        NEW.priority := least(greatest(coalesce((envelope -> 'properties' ->> 'priority')::int, 0), 0), 9);
    EXCEPTION WHEN others THEN NULL;
    END;
    BEGIN
        NEW.not_before := (envelope -> 'headers' ->> 'eta')::timestamptz;
        IF NEW.not_before <= now() THEN NEW.not_before := NULL; END IF;
    EXCEPTION WHEN others THEN NEW.not_before := NULL;
    END;
    BEGIN
        NEW.expires_at := now() + ((envelope -> 'properties' ->> 'expiration')::double precision / 1000)
                                  * interval '1 second';
    EXCEPTION WHEN others THEN NULL;
    END;
    SELECT message_ttl INTO ttl FROM {q} WHERE id = NEW.queue_id;
    IF ttl IS NOT NULL THEN
        NEW.expires_at := least(coalesce(NEW.expires_at, 'infinity'), now() + ttl * interval '1 second');
    END IF;
    NEW.filled := true;
    RETURN NEW;
END $f$;
DROP TRIGGER IF EXISTS worker_fill ON {m};
CREATE TRIGGER worker_fill BEFORE INSERT ON {m} FOR EACH ROW WHEN (NOT NEW.filled)
    EXECUTE FUNCTION {s}.worker_fill_message();

CREATE OR REPLACE FUNCTION {s}.worker_notify_message() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NEW.not_before IS NULL THEN
        PERFORM pg_notify(TG_ARGV[0], NEW.queue_id::text);
    ELSE
        PERFORM pg_notify(TG_ARGV[0], NEW.queue_id::text || '@' || extract(epoch FROM NEW.not_before)::text);
    END IF;
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS worker_notify ON {m};
CREATE TRIGGER worker_notify AFTER INSERT ON {m} FOR EACH ROW WHEN (NEW.visible IS NOT FALSE)
    EXECUTE FUNCTION {s}.worker_notify_message({literal(n.message_channel)});
DROP TRIGGER IF EXISTS worker_notify_again ON {m};
CREATE TRIGGER worker_notify_again AFTER UPDATE OF visible ON {m} FOR EACH ROW
    WHEN (NEW.visible AND OLD.visible IS FALSE)
    EXECUTE FUNCTION {s}.worker_notify_message({literal(n.message_channel)});

CREATE TABLE IF NOT EXISTS {n.exchanges} (name text PRIMARY KEY, type text NOT NULL);
CREATE TABLE IF NOT EXISTS {n.bindings} (
    exchange text NOT NULL,
    routing_key text NOT NULL,
    pattern text NOT NULL,
    queue text NOT NULL,
    PRIMARY KEY (exchange, routing_key, pattern, queue)
);
CREATE INDEX IF NOT EXISTS worker_bindings_queue ON {n.bindings} (queue);
CREATE TABLE IF NOT EXISTS {n.counters} (
    name text PRIMARY KEY,
    value bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
"""


def _results_v1(n: Names) -> str:
    s, t, g = n.schema, n.taskmeta, n.tasksetmeta
    ready = "('SUCCESS', 'FAILURE', 'REVOKED')"
    return f"""
CREATE SEQUENCE IF NOT EXISTS {s}.task_id_sequence;
CREATE SEQUENCE IF NOT EXISTS {s}.taskset_id_sequence;
CREATE TABLE IF NOT EXISTS {t} (
    id integer NOT NULL DEFAULT nextval({n.sequence("task_id_sequence")}) PRIMARY KEY,
    task_id varchar(155) UNIQUE,
    status varchar(50),
    result bytea,
    date_done timestamp,
    traceback text,
    children bytea
);
ALTER TABLE {t} ALTER COLUMN id SET DEFAULT nextval({n.sequence('task_id_sequence')});
ALTER TABLE {t}
    ADD COLUMN IF NOT EXISTS name varchar(155),
    ADD COLUMN IF NOT EXISTS args bytea,
    ADD COLUMN IF NOT EXISTS kwargs bytea,
    ADD COLUMN IF NOT EXISTS worker varchar(155),
    ADD COLUMN IF NOT EXISTS retries integer,
    ADD COLUMN IF NOT EXISTS queue varchar(155),
    ADD COLUMN IF NOT EXISTS stamps bytea,
    -- this plugin's, beyond Celery's layout: the canvas links Celery's other backends keep, and
    -- the content type of a result stored in a serializer of its task's own
    ADD COLUMN IF NOT EXISTS parent_id varchar(155),
    ADD COLUMN IF NOT EXISTS group_id varchar(155),
    ADD COLUMN IF NOT EXISTS content_type varchar(100);
ALTER TABLE {t} SET (autovacuum_vacuum_scale_factor = 0.05);
CREATE INDEX IF NOT EXISTS ix_celery_taskmeta_date_done ON {t} (date_done);
CREATE TABLE IF NOT EXISTS {g} (
    id integer NOT NULL DEFAULT nextval({n.sequence("taskset_id_sequence")}) PRIMARY KEY,
    taskset_id varchar(155) UNIQUE,
    result bytea,
    date_done timestamp
);
ALTER TABLE {g} ALTER COLUMN id SET DEFAULT nextval({n.sequence('taskset_id_sequence')});
CREATE INDEX IF NOT EXISTS ix_celery_tasksetmeta_date_done ON {g} (date_done);

CREATE OR REPLACE FUNCTION {s}.worker_notify_result() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], NEW.task_id);
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS worker_notify_result ON {t};
CREATE TRIGGER worker_notify_result AFTER INSERT OR UPDATE OF status ON {t} FOR EACH ROW
    WHEN (NEW.status IN {ready}) EXECUTE FUNCTION {s}.worker_notify_result({literal(n.result_channel)});

CREATE TABLE IF NOT EXISTS {n.chords} (
    group_id text PRIMARY KEY,
    size integer,
    added integer NOT NULL DEFAULT 0,
    claim text,
    claim_until timestamptz,
    expires_at timestamptz
);
CREATE TABLE IF NOT EXISTS {n.chord_parts} (
    group_id text NOT NULL,
    part text NOT NULL,
    position double precision NOT NULL,
    seq bigserial,
    task_id text NOT NULL,
    state text NOT NULL,
    result bytea NOT NULL,
    PRIMARY KEY (group_id, part)
);
"""


#: Each part's migrations, in order: the SQL of version N is the N-th item.
PARTS: dict[str, Sequence[Callable[[Names], str]]] = {
    "broker": [_broker_v1],
    "results": [_results_v1],
}
LATEST = {part: len(steps) for part, steps in PARTS.items()}


def versions(connection: Any, names: Names) -> dict[str, int]:
    """The version each part is at in ``names``'s schema (0: not created)."""
    row = connection.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{names.schema}.worker_schema",)
    ).fetchone()
    if not row[0]:
        return dict.fromkeys(PARTS, 0)
    found = dict(connection.execute(f"SELECT part, version FROM {names.versions}").fetchall())
    return {part: int(found.get(part, 0)) for part in PARTS}


def migrate(connection: Any, names: Names, parts: Sequence[str] = ("broker", "results")) -> dict[str, int]:
    """Bring ``parts`` of ``names``'s schema to the latest version, in one transaction per part on
    ``connection`` (a psycopg connection in autocommit mode); return the versions migrated from.

    :raise ConfigurationError: the schema is at a version newer than this plugin knows.
    """
    before: dict[str, int] = {}
    for part in parts:
        with connection.transaction():
            connection.execute(f"CREATE SCHEMA IF NOT EXISTS {names.schema}")
            connection.execute(
                f"""CREATE TABLE IF NOT EXISTS {names.versions} (
                    part text PRIMARY KEY, version integer NOT NULL,
                    migrated_at timestamptz NOT NULL DEFAULT now())"""
            )
            connection.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"worker-schema:{names.schema_name}:{part}",)
            )
            row = connection.execute(
                f"SELECT version FROM {names.versions} WHERE part = %s", (part,)
            ).fetchone()
            current = int(row[0]) if row else 0
            before[part] = current
            latest = LATEST[part]
            if current > latest:
                raise ConfigurationError(
                    f"the {part} tables in schema {names.schema_name!r} are at version {current}, newer than "
                    f"this worker-transport-postgres knows ({latest}): upgrade it (pip install "
                    f"./plugins/transport_postgres) on every worker and client of this database"
                )
            for version in range(current + 1, latest + 1):
                connection.execute(PARTS[part][version - 1](names))
                logger.info(
                    "Migrated the %s tables in schema %s to version %d", part, names.schema_name, version
                )
            if current < latest:
                connection.execute(
                    f"""INSERT INTO {names.versions} (part, version) VALUES (%s, %s)
                        ON CONFLICT (part) DO UPDATE SET version = excluded.version, migrated_at = now()""",
                    (part, latest),
                )
    return before

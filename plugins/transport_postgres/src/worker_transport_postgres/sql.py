"""The statements the broker runs, built once per set of tables (names quoted in, values always
passed as parameters).

A message row is *ready* while ``visible`` and ``not_before IS NULL`` (the partial index
``<table>_ready`` serves the fetch in priority then id order), *delayed* while ``not_before`` is
set (its countdown or ETA; promoted to ready when due), and *taken* while not ``visible``: leased
to ``lease_owner`` until ``lease_until`` (this plugin), or consumed by kombu's own SQLAlchemy
transport (no owner: kombu acknowledges on receipt) and deleted.
"""

from __future__ import annotations

from .schema import Names

__all__ = ["Statements"]


class Statements:
    """Every statement of the broker for the tables of ``names``."""

    def __init__(self, names: Names) -> None:
        m, q, b, e = names.messages, names.queues, names.bindings, names.exchanges
        live = "visible AND not_before IS NULL AND (expires_at IS NULL OR expires_at > now())"
        values = """%(payload)s, %(priority)s,
                CASE WHEN %(eta)s::timestamptz > now() THEN %(eta)s::timestamptz END,
                least(now() + %(ttl)s::float8 * interval '1 second',
                      now() + q.message_ttl * interval '1 second'),
                true"""
        columns = "(queue_id, payload, priority, not_before, expires_at, filled)"
        #: publish to the queue named by ``key`` (the default exchange)
        self.put_direct = (
            f"INSERT INTO {m} {columns} SELECT q.id, {values} FROM {q} AS q WHERE q.name = %(key)s"
        )
        #: publish through ``exchange``: one copy in each queue its bindings route ``key`` to
        self.put_routed = f"""INSERT INTO {m} {columns} SELECT q.id, {values} FROM {q} AS q WHERE q.name IN (
            SELECT b.queue FROM {b} AS b JOIN {e} AS e ON e.name = b.exchange WHERE b.exchange = %(exchange)s
            AND (e.type = 'fanout' OR (e.type = 'direct' AND b.routing_key = %(key)s)
                 OR (e.type = 'topic' AND %(key)s ~ b.pattern)))"""
        next_rows = f"""SELECT id FROM {m} WHERE queue_id = %s AND {live}
                        ORDER BY priority DESC, id LIMIT %s FOR UPDATE SKIP LOCKED"""
        #: take up to N ready messages of a queue, leased to an owner for a number of seconds
        self.take = f"""WITH owner AS (SELECT %s::text AS name, %s::float8 AS seconds),
                        next AS ({next_rows})
            UPDATE {m} AS m SET visible = false, delivered = m.delivered + 1, lease_owner = owner.name,
                lease_until = now() + owner.seconds * interval '1 second'
            FROM next, owner WHERE m.id = next.id
            RETURNING m.id, m.delivered, m.payload, m.priority"""
        #: take and delete up to N (a no-ack consumer: kombu's pidbox and reply queues)
        self.take_no_ack = f"""WITH next AS ({next_rows})
            DELETE FROM {m} AS m USING next WHERE m.id = next.id
            RETURNING m.id, m.delivered + 1, m.payload, m.priority"""
        #: make the due messages of some queues ready; seconds until the next one is due
        self.promote = f"""WITH promoted AS (
                UPDATE {m} SET not_before = NULL
                WHERE visible AND not_before <= now() AND queue_id = ANY(%(queues)s) RETURNING queue_id)
            SELECT (SELECT array_agg(DISTINCT queue_id) FROM promoted),
                   (SELECT extract(epoch FROM min(not_before) - now())::float8 FROM {m}
                    WHERE visible AND not_before > now() AND queue_id = ANY(%(queues)s))"""
        #: give back what lapsed leases hold, delete what kombu consumed and what expired
        self.reclaim = f"""UPDATE {m} SET visible = true, lease_owner = NULL, lease_until = NULL
            WHERE visible IS FALSE AND lease_owner IS NOT NULL AND lease_until < now()"""
        self.delete_consumed = f"DELETE FROM {m} WHERE visible IS FALSE AND lease_owner IS NULL"
        self.delete_expired = f"DELETE FROM {m} WHERE expires_at <= now() AND visible"
        #: queues whose ``x-expires`` passed without a consumer: their messages, bindings, rows
        self.expired_queues = f"""SELECT id, name FROM {q}
            WHERE expires IS NOT NULL AND used_at < now() - expires * interval '1 second'"""
        self.touch_queues = f"UPDATE {q} SET used_at = now() WHERE id = ANY(%s) AND expires IS NOT NULL"
        #: the ready messages of a queue
        self.size = f"""SELECT count(*) FROM {m} WHERE queue_id = (SELECT id FROM {q} WHERE name = %s)
            AND {live}"""
        self.declare_queue = f"""INSERT INTO {q} (name, message_ttl, expires) VALUES (%s, %s, %s)
            ON CONFLICT (name) DO UPDATE SET message_ttl = excluded.message_ttl, expires = excluded.expires,
            used_at = now() RETURNING id"""
        self.ensure_queue = f"""WITH found AS (SELECT id FROM {q} WHERE name = %(name)s),
            made AS (INSERT INTO {q} (name) SELECT %(name)s WHERE NOT EXISTS (SELECT 1 FROM found)
                     ON CONFLICT (name) DO UPDATE SET used_at = now() RETURNING id)
            SELECT id FROM found UNION ALL SELECT id FROM made"""
        self.declare_exchange = f"INSERT INTO {e} (name, type) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
        self.bind = (
            f"INSERT INTO {b} (exchange, routing_key, pattern, queue) VALUES (%s, %s, %s, %s) "
            f"ON CONFLICT DO NOTHING"
        )
        #: the poison cap's counter: add one, keep it N more seconds, give the new value
        self.count = f"""INSERT INTO {names.counters} AS c (name, value, expires_at)
            VALUES (%s, 1, now() + %s * interval '1 second')
            ON CONFLICT (name) DO UPDATE SET
                value = CASE WHEN c.expires_at <= now() THEN 1 ELSE c.value + 1 END,
                expires_at = excluded.expires_at
            RETURNING value"""
        self.forget_counters = f"DELETE FROM {names.counters} WHERE expires_at <= now()"
        #: ready, delayed and taken messages per queue (``workerctl inspect``, metrics)
        self.depths = f"""SELECT q.name,
                count(*) FILTER (WHERE m.visible AND m.not_before IS NULL),
                count(*) FILTER (WHERE m.visible AND m.not_before IS NOT NULL),
                count(*) FILTER (WHERE m.visible IS FALSE)
            FROM {q} AS q LEFT JOIN {m} AS m ON m.queue_id = q.id
            WHERE q.name = ANY(%s) GROUP BY q.name"""

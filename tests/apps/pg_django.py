"""A Django program of its own (settings configured here, on the test database) that enqueues
``apps.basic.record`` in a transaction of Django's connection: ``commit`` or ``rollback`` the
first argument, the proof file and value the next; prints the task id."""

from __future__ import annotations

import os
import sys

import django
from django.conf import settings

settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "test",
                                          "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"}},
                   USE_TZ=True)
django.setup()

from django.db import connection, transaction  # noqa: E402

from apps import basic  # noqa: E402
from worker_transport_postgres import enqueue_in  # noqa: E402


class Rollback(Exception):
    pass


def main(outcome: str, path: str, value: str) -> None:
    schema = os.environ["PG_SCHEMA"]
    basic.app.conf.update(broker_url="postgresql://postgres@127.0.0.1:5432/test",
                          broker_transport_options={"schema": schema}, task_ignore_result=True)
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f'INSERT INTO "{schema}".orders (note) VALUES (%s)', [value])
            with enqueue_in(connection):
                result = basic.record.delay(path, value)
            print(result.id, flush=True)
            if outcome == "rollback":
                raise Rollback()
    except Rollback:
        pass


if __name__ == "__main__":
    main(*sys.argv[1:4])

"""The benchmark's Django tasks, written with Django's API only (the same under every worker):
each reports to the driver as ``bench/apps/sink.py`` says (a no-op counts itself in shared
memory; the latency task sends its start time in one UDP datagram)."""

import os
import time

from django.tasks import task
from sink import noop as count
from sink import send

from .models import Note


@task()
def noop():
    count()


@task()
def write_note(text):
    """A small ORM write: one INSERT in its own transaction (autocommit)."""
    Note.objects.create(text=text, pid=os.getpid())
    count()


@task()
def started(sent_at):
    send(b"l%.9f" % (time.time() - sent_at))

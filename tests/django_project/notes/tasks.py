"""The project's tasks, written with Django's own API."""

import asyncio
import os
import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from .models import Note


@task()
def add(x, y):
    return x + y


@task()
async def add_async(x, y):
    await asyncio.sleep(0)
    return x + y


@task()
def fail(text):
    raise ValueError(text)


@task()
def write_note(text):
    """Writes through the ORM inside the worker: the row's pid is the process that ran it."""
    return Note.objects.create(text=text, pid=os.getpid()).pk


@task(takes_context=True)
def whoami(context):
    return {"id": context.task_result.id, "attempt": context.attempt}


@task(priority=0)
def log_order(label):
    Note.objects.create(text=label, pid=os.getpid())


@task()
def sleep(seconds):
    time.sleep(seconds)
    return seconds


@task(queue_name="low")
def on_low(x):
    return x


@task(priority=10)
def urgent():
    return "urgent"

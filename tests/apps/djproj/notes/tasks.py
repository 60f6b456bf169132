"""Tasks found by ``app.autodiscover_tasks()``, using the ORM."""

import os

from celery import shared_task
from django.db import connection

from .models import Note


@shared_task
def add_note(text):
    Note.objects.create(text=text, pid=os.getpid())
    return Note.objects.count()


@shared_task
def notes():
    return {"texts": sorted(Note.objects.values_list("text", flat=True)), "vendor": connection.vendor}

"""The Celery app django-tasks-celery sends the project's tasks with (BENCH_DJ_BACKEND=celery):
Celery's settings from Django's (``CELERY_*``), the project's tasks imported by the worker."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djtasks.settings")

app = Celery("djtasks")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.imports = ["djtasks.tasks"]

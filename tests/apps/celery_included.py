"""A task module a Celery app does not import itself: ``-I apps.celery_included`` brings it in."""

from __future__ import annotations

from apps.celery_basic import app


@app.task(name="apps.celery_included.included")
def included():
    return "included"

"""A Celery project laid out as Celery's docs lay one out: ``proj/celery.py`` holds the app,
``proj/tasks.py`` the tasks, and the package exposes the app as ``celery_app``."""

from .celery import app as celery_app

__all__ = ["celery_app"]

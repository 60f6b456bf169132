"""A small Django project with Celery, laid out as Celery's Django guide lays it out."""

from .celery import app as celery_app

__all__ = ["celery_app"]

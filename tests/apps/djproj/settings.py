"""Django settings: the PostgreSQL of the machine, and Celery's settings under ``CELERY_``."""

import os

SECRET_KEY = "not-a-secret-only-tests"
USE_TZ = True
INSTALLED_APPS = ["apps.djproj.notes"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("DJPROJ_DB", "test"),
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_CONCURRENCY = 2
CELERY_TASK_ACKS_LATE = True

"""Django settings: the PostgreSQL of the machine (a schema of the test's own, DJTASKS_SCHEMA) and
worker_django's backend on the broker DJTASKS_BROKER."""

import json
import os

SECRET_KEY = "not-a-secret-only-tests"
USE_TZ = True
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "site_tasks.urls"
INSTALLED_APPS = ["notes", "worker_django"]
try:
    import django.tasks  # noqa: F401  (Django 6: the framework is Django's own)
except ImportError:
    INSTALLED_APPS.append("django_tasks")  # Django 5.2: the backport, an app
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "test",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "OPTIONS": {"options": f"-c search_path={os.environ.get('DJTASKS_SCHEMA', 'public')}"},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
OPTIONS = {"broker_url": os.environ.get("DJTASKS_BROKER", "embedded://")}
if os.environ.get("DJTASKS_RESULTS"):
    OPTIONS["result_backend"] = os.environ["DJTASKS_RESULTS"]
if os.environ.get("DJTASKS_TRANSPORT_OPTIONS"):
    OPTIONS["broker_transport_options"] = json.loads(os.environ["DJTASKS_TRANSPORT_OPTIONS"])
    OPTIONS["result_backend_transport_options"] = OPTIONS["broker_transport_options"]
if os.environ.get("DJTASKS_MORE_OPTIONS"):  # the checks' tests: settings that are wrong
    OPTIONS.update(json.loads(os.environ["DJTASKS_MORE_OPTIONS"]))
TASKS = {
    "default": {
        "BACKEND": "worker_django.WorkerBackend",
        "QUEUES": json.loads(os.environ.get("DJTASKS_QUEUES", '["default", "low"]')),
        "OPTIONS": OPTIONS,
    },
}

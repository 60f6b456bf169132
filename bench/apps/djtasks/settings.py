"""Settings of the benchmark's Django project. BENCH_DJ_BACKEND chooses the backend of TASKS:

- ``worker-redis``: worker_django's backend, this worker's Redis transport (BENCH_REDIS), results
  in the same Redis;
- ``worker-postgres``: worker_django's backend, this worker's PostgreSQL transport (the tables
  in the schema BENCH_DJ_BROKER_SCHEMA), results in the same database;
- ``db``: django-tasks-db's ``DatabaseBackend`` (its ``db_worker`` runs the tasks);
- ``celery``: django-tasks-celery's ``CeleryBackend`` with Celery on BENCH_REDIS, results there.

The project's database is the PostgreSQL on 127.0.0.1:5432, database ``test``, schema
BENCH_DJ_SCHEMA (the ORM task writes there, and django-tasks-db keeps its tasks there).
"""

import os

SECRET_KEY = "not-a-secret-only-benchmarks"
USE_TZ = True
DEBUG = False
INSTALLED_APPS = ["djtasks", "worker_django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "test",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "OPTIONS": {"options": f"-c search_path={os.environ.get('BENCH_DJ_SCHEMA', 'public')}"},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

BACKEND = os.environ.get("BENCH_DJ_BACKEND", "worker-redis")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15")
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
if BACKEND == "worker-redis":
    OPTIONS = {"broker_url": REDIS}
    TASKS = {"default": {"BACKEND": "worker_django.WorkerBackend", "QUEUES": ["default"], "OPTIONS": OPTIONS}}
elif BACKEND == "worker-postgres":
    schema = {"schema": os.environ.get("BENCH_DJ_BROKER_SCHEMA", "worker_bench_django")}
    OPTIONS = {"broker_url": POSTGRES, "broker_transport_options": schema,
               "result_backend_transport_options": schema}
    TASKS = {"default": {"BACKEND": "worker_django.WorkerBackend", "QUEUES": ["default"], "OPTIONS": OPTIONS}}
elif BACKEND == "db":
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
elif BACKEND == "celery":
    CELERY_BROKER_URL = REDIS
    CELERY_RESULT_BACKEND = REDIS
    CELERY_RESULT_EXTENDED = True
    CELERY_TASK_DEFAULT_QUEUE = "default"
    TASKS = {"default": {"BACKEND": "django_tasks_celery.backend.CeleryBackend", "QUEUES": ["default"],
                         "OPTIONS": {"CELERY_APP": "djtasks.celery_app.app"}}}
else:
    raise ValueError(f"BENCH_DJ_BACKEND: {BACKEND!r}")

"""Settings for Django's own tests of its task backends (``tests/tasks`` of Django's source, the
package ``tasks``) run against worker_django's backend, for the runner (:mod:`run`) and for
the worker that runs their tasks: the tests' app ``tasks`` installed, a SQLite database (Django's
test runner makes it in memory), and, in the worker (SUITE_LOG_TASKS=1), its logs of
``django.tasks`` written as JSON lines to SUITE_TASK_LOG (the runner hands them on to the tests,
see :mod:`suite_backends`)."""

import os

SECRET_KEY = "not-a-secret-only-tests"
USE_TZ = True
INSTALLED_APPS = ["tasks", "worker_django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
# the worker's own entry: Django's tests name their backends without OPTIONS, and the runner's
# backends take their broker from SUITE_RUN_BROKER (see suite_backends)
# (the alias "immediate" is that of Django's tests that enqueue with using(backend="immediate"))
_RUN = {"BACKEND": "worker_django.WorkerBackend", "QUEUES": [],
        "OPTIONS": {"broker_url": os.environ.get("SUITE_RUN_BROKER", "embedded://")}}
TASKS = {"default": _RUN, "immediate": _RUN}
if os.environ.get("SUITE_LOG_TASKS"):  # the worker's processes (not the runner, which reads them)
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"records": {"class": "suite_backends.JsonLines",
                                 "filename": os.environ["SUITE_TASK_LOG"]}},
        "loggers": {"django.tasks": {"handlers": ["records"], "level": "DEBUG"}},
    }

"""A small Django project whose tasks are Django's own (``@task``), sent with worker_django."""

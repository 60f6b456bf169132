"""The Django project of ``bench/django_tasks.py``: the same Django tasks (``tasks.py``) sent
through one of four backends, chosen by BENCH_DJ_BACKEND (see ``settings.py``)."""

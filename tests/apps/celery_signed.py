"""A Celery app that signs what it sends and runs only signed messages (Celery's ``auth``
serializer), for a real Celery worker; the key, certificate and store come from the
environment (``CELERY_SECURITY_KEY``, ``CELERY_SECURITY_CERTIFICATE``, ``CELERY_SECURITY_CERT_STORE``)."""

from __future__ import annotations

import os

from celery import Celery

app = Celery("celery_signed", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_RESULT_BACKEND"))
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_serializer="auth",
    accept_content=["auth"],
    result_accept_content=["json"],
    security_key=os.environ["CELERY_SECURITY_KEY"],
    security_certificate=os.environ["CELERY_SECURITY_CERTIFICATE"],
    security_cert_store=os.environ["CELERY_SECURITY_CERT_STORE"],
)
app.setup_security()


@app.task(name="apps.basic.add")
def add(x, y):
    return x + y

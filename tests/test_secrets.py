"""No secret leaves the worker: passwords set on the broker URL, the result backend URL, the
transport options and the signing key are searched for in every log line, every remote-control
reply, every event and everything ``workerctl`` prints, and must not be found."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import basic
from faults import RedisServer, free_port
from workers import TESTS, WorkerProcess, wait_for

from worker_core.redaction import MASK, SecretFilter, redact_url, redact_value, secrets_of

BROKER_PASSWORD = f"broker-{uuid.uuid4().hex}"
BACKEND_PASSWORD = f"backend-{uuid.uuid4().hex}"
OPTION_PASSWORD = f"sentinel-{uuid.uuid4().hex}"
KEY_PASSWORD = f"key-{uuid.uuid4().hex}"
SECRETS = (BROKER_PASSWORD, BACKEND_PASSWORD, OPTION_PASSWORD, KEY_PASSWORD)


# -- the helper ------------------------------------------------------------------------------------


def test_urls_lose_their_passwords_in_the_user_part_and_in_secret_query_parameters():
    assert redact_url("redis://:pw@h:6379/0;amqp://u:p@r//") == "redis://:**@h:6379/0;amqp://u:**@r//"
    assert redact_url("amqp://user@host//") == "amqp://user@host//"
    assert redact_url("rediss://h:6380/0?ssl_cert_reqs=required&password=pw&ssl_keyfile_password=k") == (
        "rediss://h:6380/0?ssl_cert_reqs=required&password=**&ssl_keyfile_password=**")
    assert redact_url("embedded:///var/lib/queue.db") == "embedded:///var/lib/queue.db"


def test_settings_and_options_are_shown_with_secret_values_masked():
    options = {"sentinel_kwargs": {"password": "x"}, "visibility_timeout": 5,
               "ssl": {"ssl_keyfile": "/k.pem"}}
    assert redact_value("broker_transport_options", options) == {
        "sentinel_kwargs": {"password": MASK}, "visibility_timeout": 5, "ssl": {"ssl_keyfile": "/k.pem"}}
    assert redact_value("security_key_password", "hunter22") == MASK
    assert redact_value("result_backend", "redis://:pw@h/1") == "redis://:**@h/1"
    assert redact_value("result_expires", None) is None


def test_the_secrets_of_the_settings_are_found_in_urls_options_and_secret_names():
    found = secrets_of({
        "broker_url": "redis://u:p%40ss-word@h/0;redis://u:second-pw@h2/0",
        "result_backend": "redis://h/1?password=query-pw",
        "broker_transport_options": {"sentinel_kwargs": {"password": "sentinel-pw"}, "master_name": "m"},
        "security_key_password": "key-password",
        "short": "pw",
        "brokers": ("amqp://guest:guest@rabbit//",),  # the user name shows it anyway
    })
    assert found == {"p%40ss-word", "p@ss-word", "second-pw", "query-pw", "sentinel-pw", "key-password"}


def test_the_log_filter_hides_secrets_in_messages_arguments_and_tracebacks():
    import logging

    guard = SecretFilter({"s3cret-pw"})
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "connecting to %s failed", ("redis://:s3cret-pw@h",),
                               None)
    try:
        raise RuntimeError("auth s3cret-pw refused")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert guard.filter(record)
    assert record.getMessage() == f"connecting to redis://:{MASK}@h failed"
    assert "s3cret-pw" not in record.exc_text and MASK in record.exc_text


# -- a real worker -----------------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own whose users need passwords (the default user is off)."""
    import redis

    running = RedisServer(tmp_path).start()
    try:
        admin = redis.Redis(port=running.port)
        for user, password in (("brokeruser", BROKER_PASSWORD), ("backenduser", BACKEND_PASSWORD)):
            admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"],
                              commands=["+@all"])
        admin.acl_setuser("default", enabled=False)
        admin.close()
        yield running
    finally:
        running.stop()


def _environment(server: RedisServer) -> dict[str, str]:
    return dict(
        os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(TESTS),
        WORKER_BROKER_URL=f"redis://brokeruser:{BROKER_PASSWORD}@127.0.0.1:{server.port}/0",
        WORKER_RESULT_BACKEND=f"redis://backenduser:{BACKEND_PASSWORD}@127.0.0.1:{server.port}/1",
        WORKER_BROKER_TRANSPORT_OPTIONS=json.dumps({"sentinel_kwargs": {"password": OPTION_PASSWORD}}),
        WORKER_SECURITY_KEY_PASSWORD=KEY_PASSWORD,
    )


def _workerctl(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "worker_core", *args], env=env, cwd=TESTS,
                          capture_output=True, text=True, timeout=60)
    return f"$ workerctl {' '.join(args)} (exit {done.returncode})\n{done.stdout}{done.stderr}"


class Events:
    """Every message published on the broker's pub/sub: the worker's monitoring events and the
    result backend's notices."""

    def __init__(self, server: RedisServer) -> None:
        import redis

        # (kept: a client that is collected closes its connections, the subscription's too)
        self.client = redis.Redis(port=server.port, username="brokeruser", password=BROKER_PASSWORD)
        self.pubsub = self.client.pubsub()
        self.pubsub.psubscribe("*")
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            message = self.pubsub.get_message(timeout=0.1)
            if message and message["type"] == "pmessage":
                data = message["data"].decode(errors="replace")
                self.seen.append(data)
                envelope = json.loads(data)
                if "body" in envelope:  # an event in kombu's envelope: its body, base64, is read too
                    self.seen.append(base64.b64decode(envelope["body"]).decode(errors="replace"))

    def close(self) -> str:
        self._stop.set()
        self._thread.join(5)
        self.pubsub.close()
        self.client.close()
        return "\n".join(self.seen)


def test_no_password_appears_in_logs_replies_events_or_workerctl_output(server, workers, tmp_path):
    env = _environment(server)
    events = Events(server)
    name = f"secrets-{uuid.uuid4().hex[:8]}@localhost"
    worker = WorkerProcess(["-A", "apps.basic", "-P", "prefork", "-c", "1", "-l", "DEBUG", "-E", "-n", name],
                           env, tmp_path / "worker.log")
    workers.started.append(worker)
    worker.wait_ready()
    outputs = []
    try:
        basic.app.conf.update(broker_url=env["WORKER_BROKER_URL"],
                              result_backend=env["WORKER_RESULT_BACKEND"])
        assert basic.add.delay(2, 3).get(timeout=20) == 5
        with pytest.raises(basic.Boom):
            basic.boom.delay("a failure with a traceback in the log").get(timeout=20)
        # (to the worker by name: the command returns with its reply rather than after the timeout)
        for command in ("ping", "stats", "conf", "active_queues", "registered", "active"):
            outputs.append(_workerctl(env, "inspect", command, "--json", "-t", "5", "-d", name))
        outputs.append(_workerctl(env, "control", "rate-limit", "apps.basic.add", "10/s", "-t", "5",
                                  "-d", name))
        outputs.append(_workerctl(env, "call", "apps.basic.add", "--args", "[1, 2]", "--wait",
                                  "--timeout", "20"))
        outputs.append(_workerctl(env, "steps", "-A", "apps.basic"))
        outputs.append(_workerctl(env, "plugins"))
        # errors that name a broker: a URL the transport refuses, and one nobody answers
        bad = dict(env, WORKER_BROKER_URL=f"redis://brokeruser:{BROKER_PASSWORD}@127.0.0.1:{server.port}/zero")
        outputs.append(_workerctl(bad, "worker", "-A", "apps.basic"))
        closed = dict(env, WORKER_BROKER_URL=f"redis://brokeruser:{BROKER_PASSWORD}@127.0.0.1:{free_port()}/0")
        outputs.append(_workerctl(closed, "call", "apps.basic.add", "--args", "[1, 2]"))
        unreachable = WorkerProcess(["-A", "apps.basic", "-P", "solo", "-l", "DEBUG"], closed,
                                    tmp_path / "unreachable.log")
        workers.started.append(unreachable)
        unreachable.wait_log("Cannot connect to", timeout=20)
        outputs.append(unreachable.log())
        unreachable.kill()
        wait_for(lambda: '"task-succeeded"' in "".join(events.seen), 10, message="the task events")
    finally:
        basic.app.close()
        everything = [*outputs, events.close()]
    assert worker.stop() == 0
    everything.append(worker.log())
    text = "\n".join(everything)
    for secret in SECRETS:
        assert secret not in text, f"{secret} found in:\n" + "\n".join(
            line for line in text.splitlines() if secret in line)
    # what was shown is there, masked: the search above looked at real output
    assert f"brokeruser:**@127.0.0.1:{server.port}" in worker.log()
    assert "security_key_password" in text and MASK in text
    assert "Cannot connect to redis://brokeruser:**@" in text
    assert "names database 'zero'" in text

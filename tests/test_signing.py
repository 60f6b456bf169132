"""Signed messages (Celery's ``auth`` serializer) in both directions: the serializer against
Celery's own, a real Celery client feeding ``workerctl worker``, this project's client feeding a
real ``celery worker``, and a worker that accepts signed messages only refusing every other kind
with one line and a FAILURE its client reads at once."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import kombu
import pytest
from certs import Issued, make_authority
from conftest import AMQP_TEST_URL, delete_queue, empty_redis, redis_db, require_server
from kombu.serialization import registry
from workers import TESTS

from worker_core import App, signing
from worker_core.app.broker import task_queue
from worker_core.app.settings import Settings
from worker_core.exceptions import ConfigurationError, ContentDisallowed, DecodeError, SecurityError
from worker_core.protocol import decode_task, task_message

REDIS_SIGNING_URL = redis_db(12)  # this file's database of the shared Redis
PASSWORD = "correct horse"


@attrs.frozen
class Pki:
    """Signers issued by one authority, and the stores that trust some of them."""

    good: Issued
    stranger: Issued  # in no store
    expired: Issued
    locked: Issued  # its key is encrypted with PASSWORD
    store: Path  # good, expired and locked: what this project's workers trust
    celery_store: Path  # good only: Celery refuses to start with an expired certificate in its store


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    authority = make_authority(tmp_path / "pki", "signing-ca")
    good = authority.issue("good", server=False)
    stranger = authority.issue("stranger", server=False)
    expired = authority.issue("expired", server=False, expired=True)
    locked = authority.issue("locked", server=False, key_password=PASSWORD)
    store, celery_store = tmp_path / "store", tmp_path / "celery-store"
    store.mkdir()
    celery_store.mkdir()
    for issued in (good, expired, locked):
        shutil.copy(issued.cert, store)
    shutil.copy(good.cert, celery_store)
    return Pki(good, stranger, expired, locked, store, celery_store)


@pytest.fixture(autouse=True)
def kombu_registry() -> Iterator[None]:
    """kombu's serializer registry as it was: Celery's ``setup_security`` and ours change it for
    the whole process (the ``auth`` serializer, disabled decoders, the default serializer)."""
    saved = {name: getattr(registry, name) for name in ("_encoders", "_decoders", "type_to_name",
                                                         "name_to_type", "_disabled_content_types")}
    copies = {name: value.copy() for name, value in saved.items()}
    default = (registry._default_encode, registry._default_content_type,
               registry._default_content_encoding)
    yield
    for name, value in copies.items():
        setattr(registry, name, value)
    (registry._default_encode, registry._default_content_type,
     registry._default_content_encoding) = default


def settings_for(pki: Pki, signer: Issued | None = None, **changes: Any) -> Settings:
    signer = signer or pki.good
    values: dict[str, Any] = dict(task_serializer="auth", accept_content=("auth",),
                                  security_key=str(signer.key), security_certificate=str(signer.cert),
                                  security_cert_store=str(pki.store))
    values.update(changes)
    return Settings(**values)


def celery_serializer(pki: Pki, signer: Issued) -> Any:
    """Celery's own serializer, signing as ``signer`` and trusting Celery's store."""
    from celery.security.certificate import Certificate, FSCertStore
    from celery.security.key import PrivateKey
    from celery.security.serialization import SecureSerializer

    return SecureSerializer(PrivateKey(signer.key.read_text()), Certificate(signer.cert.read_text()),
                            FSCertStore(str(pki.celery_store)), "sha256")


BODY = [[2, 3], {"note": "ünïcode"}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]


# -- the serializer --------------------------------------------------------------------------------


def test_a_signed_body_round_trips_and_names_its_signer_as_celery_does(pki: Pki) -> None:
    serializer = signing.build(settings_for(pki))
    content_type, encoding, body = serializer.dumps(BODY)
    assert (content_type, encoding) == ("application/data", "utf-8")
    assert serializer.loads(body) == BODY
    envelope = signing.unpack(body)
    from celery.security.certificate import Certificate

    assert envelope.signer == Certificate(pki.good.cert.read_text()).get_id()
    assert envelope.signer.endswith(f" {pki.good.serial}")


def test_celery_verifies_what_we_sign_and_we_verify_what_celery_signs(pki: Pki) -> None:
    ours = signing.build(settings_for(pki))
    theirs = celery_serializer(pki, pki.good)
    our_body = ours.encode(BODY)
    their_body = theirs.serialize(BODY)
    assert theirs.deserialize(our_body) == BODY
    assert ours.loads(their_body) == BODY
    # Byte for byte the same envelope: only the signature differs (PSS salts every signature).
    our_envelope, their_envelope = signing.unpack(our_body), signing.unpack(their_body)
    assert attrs.evolve(our_envelope, signature=b"") == attrs.evolve(their_envelope, signature=b"")
    assert signing.pack(their_envelope) == their_body
    unpacked = theirs._unpack(our_body)
    assert (unpacked["signer"].decode(), unpacked["signature"], unpacked["content_type"],
            unpacked["content_encoding"], unpacked["body"]) == (
        our_envelope.signer, our_envelope.signature, "application/json", "utf-8", our_envelope.body)


def test_a_body_changed_after_signing_is_refused_as_a_bad_signature(pki: Pki) -> None:
    serializer = signing.build(settings_for(pki))
    envelope = signing.unpack(serializer.encode(BODY))
    changed = envelope.body.replace(b"[2, 3]", b"[2, 4]")
    assert changed != envelope.body
    with pytest.raises(SecurityError, match=rf"bad signature from '.* {pki.good.serial}' "
                                            rf"\(subject CN=good\): the body was changed"):
        serializer.loads(signing.pack(attrs.evolve(envelope, body=changed)))


def test_a_signer_missing_from_the_store_is_refused_by_its_id(pki: Pki) -> None:
    body = signing.build(settings_for(pki, pki.stranger)).encode(BODY)
    verifier = signing.build(settings_for(pki))
    with pytest.raises(SecurityError, match=rf"unknown certificate '.* {pki.stranger.serial}'"):
        verifier.loads(body)


def test_a_signer_whose_certificate_expired_is_refused(pki: Pki) -> None:
    body = celery_serializer(pki, pki.expired).serialize(BODY)  # Celery signs with it all the same
    with pytest.raises(SecurityError, match=r"signed by certificate '.*' \(subject CN=expired\), which "
                                            r"expired on"):
        signing.build(settings_for(pki)).loads(body)


@pytest.mark.parametrize("body", ["not base64 at all!", "aGVsbG8=", b"\x00\x01\x02"])
def test_a_body_that_is_not_a_signed_envelope_is_refused(pki: Pki, body: Any) -> None:
    with pytest.raises(SecurityError, match="body is not a signed message"):
        signing.build(settings_for(pki)).loads(body)


def test_pickle_inside_a_signed_message_needs_pickle_in_accept_content(pki: Pki) -> None:
    body = signing.build(settings_for(pki), inner="pickle").encode(BODY)
    with pytest.raises(ContentDisallowed, match="'application/x-python-serialize', which is not accepted "
                                                "inside signed messages"):
        signing.build(settings_for(pki)).loads(body)
    assert signing.build(settings_for(pki, accept_content=("auth", "pickle"))).loads(body) == BODY


def test_a_signed_body_that_is_not_json_is_a_decode_error(pki: Pki) -> None:
    serializer = signing.build(settings_for(pki))
    envelope = signing.unpack(serializer.encode(BODY))
    from cryptography.hazmat.primitives import hashes

    from worker_core.signing.primitives import sign

    garbage = b"[[2, 3], {"
    body = signing.pack(attrs.evolve(envelope, body=garbage,
                                     signature=sign(serializer.key, garbage, hashes.SHA256())))
    with pytest.raises(DecodeError, match="signed body cannot be decoded as application/json"):
        serializer.loads(body)


def message_parts(serializer: Any, body: Any = BODY) -> tuple[dict[str, Any], dict[str, Any], str]:
    message = task_message("apps.basic.add", str(uuid.uuid4()), body[0], body[1])
    return message.headers, message.properties, serializer.encode(list(message.body))


def test_the_decoder_verifies_through_kombu_and_keeps_the_security_error(pki: Pki) -> None:
    signing.register(signing.build(settings_for(pki)))
    accept = frozenset({"application/data"})
    headers, properties, body = message_parts(signing.build(settings_for(pki)))
    envelope = decode_task(headers, properties, body, "application/data", "utf-8", accept=accept,
                           max_size=1 << 20)
    assert (envelope.args, envelope.kwargs) == (BODY[0], BODY[1])
    headers, properties, body = message_parts(signing.build(settings_for(pki, pki.stranger)))
    with pytest.raises(SecurityError, match="unknown certificate"):
        decode_task(headers, properties, body, "application/data", "utf-8", accept=accept, max_size=1 << 20)


def test_the_decoder_tells_an_unsigned_message_that_only_signed_ones_are_accepted() -> None:
    message = task_message("apps.basic.add", str(uuid.uuid4()), [2, 3])
    with pytest.raises(ContentDisallowed, match=r"content type 'application/json' is not accepted: this "
                                                r"worker only accepts signed messages \(accept_content="):
        decode_task(message.headers, message.properties, '[[2, 3], {}, {}]', "application/json", "utf-8",
                    accept=frozenset({"application/data"}), max_size=1 << 20)


# -- settings and files --------------------------------------------------------------------------


def test_a_worker_that_verifies_needs_the_store(pki: Pki) -> None:
    with pytest.raises(ConfigurationError, match="setting 'security_cert_store' is not set; a worker that "
                                                 "accepts signed messages"):
        signing.build(Settings(accept_content=("auth",)))


@pytest.mark.parametrize("missing", ["security_key", "security_certificate"])
def test_a_client_that_signs_needs_its_key_and_certificate(pki: Pki, missing: str) -> None:
    with pytest.raises(ConfigurationError, match=f"setting '{missing}' is not set; a client that signs"):
        signing.build(settings_for(pki, accept_content=("json",), **{missing: None}))


def test_a_key_that_cannot_be_read_is_named_with_its_file(pki: Pki, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.key"
    with pytest.raises(ConfigurationError, match=rf"setting 'security_key': cannot read '{missing}': No such "
                                                 rf"file or directory"):
        signing.build(settings_for(pki, security_key=str(missing)))


def test_a_wrong_key_password_is_named_and_never_shown(pki: Pki) -> None:
    with pytest.raises(ConfigurationError) as refused:
        signing.build(settings_for(pki, pki.locked, security_key_password="wrong horse"))
    assert "setting 'security_key_password' does not decrypt the key in" in str(refused.value)
    assert "wrong horse" not in str(refused.value)
    assert signing.build(settings_for(pki, pki.locked, security_key_password=PASSWORD)).key is not None


def test_an_encrypted_key_without_its_password_says_to_set_it(pki: Pki) -> None:
    with pytest.raises(ConfigurationError, match="is encrypted; set security_key_password"):
        signing.build(settings_for(pki, pki.locked))


def test_a_certificate_that_is_not_the_keys_is_refused(pki: Pki) -> None:
    with pytest.raises(ConfigurationError, match="is not the certificate of security_key"):
        signing.build(settings_for(pki, security_certificate=str(pki.stranger.cert)))


def test_signing_with_an_expired_certificate_is_refused_at_start(pki: Pki) -> None:
    with pytest.raises(ConfigurationError, match=r"setting 'security_certificate': the certificate in .* "
                                                 r"expired on .*: renew it"):
        signing.build(settings_for(pki, pki.expired))


def test_a_store_holding_a_key_file_names_the_file(pki: Pki) -> None:
    shutil.copy(pki.good.key, pki.store / "oops.key")
    with pytest.raises(ConfigurationError, match=r"setting 'security_cert_store': '.*oops.key' holds no PEM "
                                                 r"certificate \(found a PEM PRIVATE KEY\)"):
        signing.build(settings_for(pki))


def test_a_store_that_names_nothing_is_refused(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"setting 'security_cert_store': '.*/none/\*.pem' names no "
                                                 r"file"):
        signing.build(settings_for(pki, security_cert_store=str(tmp_path / "none" / "*.pem")))


def test_a_store_may_be_a_glob_or_a_single_file(pki: Pki) -> None:
    body = signing.build(settings_for(pki)).encode(BODY)
    for store in (pki.store / "*.crt", pki.good.cert):
        assert signing.build(settings_for(pki, security_cert_store=str(store))).loads(body) == BODY


def test_an_unknown_digest_suggests_the_closest(pki: Pki) -> None:
    with pytest.raises(ConfigurationError, match=r"setting 'security_digest' names no digest "
                                                 r"\(got 'sha265'\)\. Did you mean 'sha256'"):
        signing.build(settings_for(pki, security_digest="sha265"))


def test_setup_security_takes_celerys_arguments_and_registers_auth_with_kombu(pki: Pki) -> None:
    app = App("signer", broker="embedded://", task_serializer="auth", accept_content=["auth"])
    app.setup_security(key=str(pki.good.key), cert=str(pki.good.cert), store=str(pki.store))
    assert app.conf.security_cert_store == str(pki.store)
    assert registry.name_to_type["auth"] == "application/data"
    from kombu.serialization import dumps, loads

    content_type, encoding, body = dumps(BODY, serializer="auth")
    assert loads(body, content_type, encoding, accept={"application/data"}) == BODY


def test_setup_security_disables_other_decoders_when_asked_as_celery_does(pki: Pki) -> None:
    from kombu.exceptions import ContentDisallowed as KombuContentDisallowed
    from kombu.serialization import dumps, loads

    app = App("signer", broker="embedded://", task_serializer="auth", accept_content=["auth"])
    app.setup_security(allowed_serializers=["json"], key=str(pki.good.key), cert=str(pki.good.cert),
                       store=str(pki.store))
    content_type, encoding, body = dumps(BODY, serializer="pickle")
    with pytest.raises(KombuContentDisallowed):
        loads(body, content_type, encoding)
    content_type, encoding, body = dumps(BODY, serializer="auth")
    assert loads(body, content_type, encoding) == BODY


def test_the_signing_package_exports_what_it_means_to() -> None:
    assert sorted(signing.__all__) == ["AUTH", "CONTENT_TYPE", "Envelope", "build", "is_used", "pack",
                                       "register", "requires_signatures", "setup", "signs", "unpack",
                                       "verifies"]


def test_setup_security_with_nothing_to_set_up_says_what_to_set() -> None:
    with pytest.raises(ConfigurationError, match="setup_security\\(\\) has nothing to set up"):
        App("plain", broker="embedded://").setup_security()


def test_worker_core_works_without_cryptography_until_signing_is_used(tmp_path: Path) -> None:
    script = f"""
import sys
sys.modules["cryptography"] = None  # as if it were not installed
from worker_core import App
from worker_core.exceptions import ConfigurationError
app = App("plain", broker="embedded://{tmp_path}/queue.db", result_backend="disabled")
app.send_task("apps.basic.add", (1, 2))
assert not any(name.startswith("cryptography") and sys.modules[name] for name in sys.modules)
signer = App("signer", broker="embedded://{tmp_path}/queue.db", result_backend="disabled",
             task_serializer="auth")
try:
    signer.send_task("apps.basic.add", (1, 2))
except ConfigurationError as exc:
    print(exc)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "need the cryptography package" in run.stdout
    assert "pip install './core[auth]'" in run.stdout


# -- settings errors at start --------------------------------------------------------------------


def run_worker(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "worker_core", "worker", "-A", "apps.basic", "-P", "solo",
         "-b", f"embedded://{tmp_path}/queue.db"],
        cwd=TESTS, env=environment, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize("case", ["missing store", "unreadable key", "wrong key password"])
def test_bad_signing_settings_stop_the_worker_with_one_line_and_status_2(
        pki: Pki, tmp_path: Path, case: str) -> None:
    env, expected = {
        "missing store": ({"WORKER_ACCEPT_CONTENT": "auth"},
                          "Error: setting 'security_cert_store' is not set"),
        "unreadable key": ({"WORKER_TASK_SERIALIZER": "auth", "WORKER_SECURITY_KEY": str(tmp_path / "no.key"),
                            "WORKER_SECURITY_CERTIFICATE": str(pki.good.cert)},
                           f"Error: setting 'security_key': cannot read '{tmp_path / 'no.key'}'"),
        "wrong key password": ({"WORKER_TASK_SERIALIZER": "auth", "WORKER_SECURITY_KEY": str(pki.locked.key),
                                "WORKER_SECURITY_CERTIFICATE": str(pki.locked.cert),
                                "WORKER_SECURITY_KEY_PASSWORD": "wrong horse"},
                               "Error: setting 'security_key_password' does not decrypt the key in"),
    }[case]
    run = run_worker(tmp_path, env)
    assert run.returncode == 2, run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), run.stderr
    assert "wrong horse" not in run.stdout + run.stderr
    assert not (tmp_path / "queue.db").exists()  # nothing started


# -- real clients and workers, over Redis ------------------------------------------------------


@pytest.fixture
def redis12() -> str:
    """This file's Redis database, emptied before the test."""
    return empty_redis(REDIS_SIGNING_URL)


@pytest.fixture
def queue() -> str:
    return f"signed-{uuid.uuid4().hex[:8]}"


def verifying_env(pki: Pki, **more: str) -> dict[str, str]:
    """A worker that accepts signed messages only, trusting ``pki.store``."""
    return {"WORKER_ACCEPT_CONTENT": "auth", "WORKER_SECURITY_CERT_STORE": str(pki.store), **more}


@pytest.fixture
def celery_signing_client(pki: Pki, redis12: str) -> Iterator[Any]:
    from celery import Celery

    app = Celery("signing-client", broker=redis12, backend=redis12)
    app.conf.update(
        broker_connection_retry_on_startup=True, task_serializer="auth", accept_content=["auth"],
        result_accept_content=["json"],  # this worker stores results as JSON
        security_key=str(pki.good.key), security_certificate=str(pki.good.cert),
        security_cert_store=str(pki.celery_store),
    )
    app.setup_security()
    yield app
    app.close()


@pytest.fixture
def celery_reader(redis12: str) -> Iterator[Any]:
    """A plain Celery client, to read results as a Celery user would."""
    from celery import Celery

    app = Celery("reader", broker=redis12, backend=redis12)
    yield app
    app.close()


def our_client(redis12: str, signer: Issued | None = None) -> App:
    settings: dict[str, Any] = {}
    if signer is not None:
        settings = dict(task_serializer="auth", security_key=str(signer.key),
                        security_certificate=str(signer.cert))
    return App("signing-client", broker=redis12, backend=redis12, **settings)


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_celery_client_signs_and_our_worker_verifies_and_runs_it(
        workers, pki: Pki, redis12: str, queue: str, celery_signing_client: Any, pool: str) -> None:
    workers.start("-Q", queue, "-c", "1", pool=pool, broker=redis12, backend=redis12, env=verifying_env(pki))
    result = celery_signing_client.send_task("apps.basic.add", (2, 3), queue=queue)
    assert result.get(timeout=20) == 5
    assert celery_signing_client.send_task("apps.basic.echo", ({"é": [1, None]},), queue=queue).get(
        timeout=20) == {"é": [1, None]}


AMQP_URL = AMQP_TEST_URL


def test_a_celery_client_signs_over_rabbitmq_and_our_worker_verifies_and_runs_it(
        workers, pki: Pki, redis12: str, queue: str, celery_signing_client: Any) -> None:
    require_server(5672, "RabbitMQ")
    celery_signing_client.conf.broker_url = AMQP_URL
    try:
        workers.start("-Q", queue, broker=AMQP_URL, backend=redis12, env=verifying_env(pki))
        assert celery_signing_client.send_task("apps.basic.add", (2, 3), queue=queue).get(timeout=20) == 5
    finally:
        workers.cleanup()
        delete_queue(AMQP_URL, queue)


def test_our_client_signs_and_a_celery_worker_verifies_and_runs_it(
        workers, pki: Pki, redis12: str, queue: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_SECURITY_KEY", str(pki.good.key))
    monkeypatch.setenv("CELERY_SECURITY_CERTIFICATE", str(pki.good.cert))
    monkeypatch.setenv("CELERY_SECURITY_CERT_STORE", str(pki.celery_store))
    workers.start_celery("-Q", queue, app="apps.celery_signed", broker=redis12, backend=redis12)
    client = our_client(redis12, pki.good)
    try:
        assert client.send_task("apps.basic.add", (2, 3), queue=queue).get(timeout=20) == 5
        assert client.send_task("apps.basic.add", (40, 2), queue=queue).get(timeout=20) == 42
    finally:
        client.close()


def test_our_worker_signs_what_it_sends_when_it_runs_with_a_key(
        workers, pki: Pki, redis12: str, queue: str) -> None:
    env = verifying_env(pki, WORKER_TASK_SERIALIZER="auth", WORKER_SECURITY_KEY=str(pki.locked.key),
                        WORKER_SECURITY_KEY_PASSWORD=PASSWORD,
                        WORKER_SECURITY_CERTIFICATE=str(pki.locked.cert))
    worker = workers.start("-Q", queue, "-c", "1", pool="prefork", broker=redis12, backend=redis12, env=env)
    client = our_client(redis12, pki.good)
    try:
        # each retry is a new message from the worker's own process: refused unless signed
        assert client.send_task("apps.basic.flaky", (2,), queue=queue).get(timeout=20) == 2
    finally:
        client.close()
    assert "Rejected" not in worker.log()
    assert PASSWORD not in worker.log()


def publish(url: str, queue: str, body: Any, content_type: str, args: list[Any]) -> str:
    """Publish a task message with ``body`` as it is; return its task id."""
    task_id = str(uuid.uuid4())
    message = task_message("apps.basic.add", task_id, args)
    with kombu.Connection(url) as connection:
        connection.Producer().publish(
            body, exchange="", routing_key=queue, declare=[task_queue(queue, Settings())],
            content_type=content_type, content_encoding="utf-8", headers=message.headers,
            **message.properties,
        )
    return task_id


def test_a_worker_that_requires_signatures_refuses_every_other_message_and_carries_on(
        workers, pki: Pki, redis12: str, queue: str, celery_reader: Any) -> None:
    from celery.exceptions import SecurityError as CelerySecurityError
    from kombu.exceptions import ContentDisallowed as KombuContentDisallowed

    worker = workers.start("-Q", queue, broker=redis12, backend=redis12, env=verifying_env(pki))
    good = signing.build(settings_for(pki))
    sent_good = good.encode([[2, 3], {}, {}])
    envelope = signing.unpack(sent_good)
    tampered = signing.pack(attrs.evolve(envelope, body=envelope.body.replace(b"[2, 3]", b"[2, 4]")))
    assert tampered != sent_good
    plain = our_client(redis12)
    try:
        refused = {
            "unsigned": (plain.send_task("apps.basic.add", (2, 3), queue=queue).id,
                         "this worker only accepts signed messages", ContentDisallowed,
                         KombuContentDisallowed),
            "changed": (publish(redis12, queue, tampered, "application/data", [2, 4]),
                        "bad signature from", SecurityError, CelerySecurityError),
            "stranger": (publish(redis12, queue, signing.build(settings_for(pki, pki.stranger)).encode(
                [[2, 3], {}, {}]), "application/data", [2, 3]),
                         f"signed by an unknown certificate '{envelope.signer.rsplit(' ', 1)[0]} "
                         f"{pki.stranger.serial}'", SecurityError, CelerySecurityError),
            "expired": (publish(redis12, queue, celery_serializer(pki, pki.expired).serialize(
                [[2, 3], {}, {}]), "application/data", [2, 3]),
                        "which expired on", SecurityError, CelerySecurityError),
        }
        for case, (task_id, reason, ours, theirs) in refused.items():
            # the dead-letter line is logged after the rejection, once the message is moved there
            worker.wait_log(f"Sent 'apps.basic.add'['{task_id}'] from queue '{queue}' "
                            "to the dead-letter queue")
            lines = [line for line in worker.log().splitlines() if task_id in line]
            rejected = [line for line in lines if "Rejected message" in line]
            assert len(rejected) == 1 and reason in rejected[0], (case, lines)
            with pytest.raises(ours, match=re.escape(reason[:20])):
                plain.AsyncResult(task_id).get(timeout=10)
            with pytest.raises(theirs):
                celery_reader.AsyncResult(task_id).get(timeout=10)
        signer = our_client(redis12, pki.good)
        try:
            assert signer.send_task("apps.basic.add", (20, 22), queue=queue).get(timeout=20) == 42
        finally:
            signer.close()
    finally:
        plain.close()

"""Building the ``auth`` serializer from the app's ``security_*`` settings and registering it
with kombu, so messages are signed as they are published and verified before they are decoded."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..exceptions import ConfigurationError
from .crypto import require_cryptography
from .envelope import AUTH, CONTENT_ENCODING, CONTENT_TYPE

if TYPE_CHECKING:
    from ..app.settings import Settings
    from .serializer import SignedSerializer

__all__ = ["build", "is_used", "register", "requires_signatures", "setup", "signs", "verifies"]

logger = logging.getLogger("worker.signing")


def verifies(settings: Settings) -> bool:
    """Whether signed messages are accepted (``'auth'`` in ``accept_content``)."""
    return AUTH in settings.accept_content or CONTENT_TYPE in settings.accept_content


def requires_signatures(settings: Settings) -> bool:
    """Whether only signed messages are accepted (``accept_content=['auth']``, Celery's way)."""
    return verifies(settings) and set(settings.accept_content) <= {AUTH, CONTENT_TYPE}


def signs(settings: Settings, serializers: Iterable[str | None] = ()) -> bool:
    """Whether messages are sent signed: ``task_serializer='auth'``, or a task's own serializer."""
    return settings.task_serializer == AUTH or AUTH in set(serializers)


def is_used(settings: Settings, serializers: Iterable[str | None] = ()) -> bool:
    """Whether messages are signed or verified at all (else ``cryptography`` is never imported)."""
    return verifies(settings) or signs(settings, serializers)


_SIGNING = ("a client that signs messages (task_serializer='auth') needs it: set security_key and "
            "security_certificate to the signer's PEM private key and certificate files")
_VERIFYING = ("a worker that accepts signed messages (accept_content=['auth']) verifies them against "
              "it: set it to a directory of trusted PEM certificates, a file, or a glob pattern")


def _check_present(settings: Settings, *, sign: bool) -> None:
    if sign:
        for name in ("security_key", "security_certificate"):
            if not getattr(settings, name):
                raise ConfigurationError(f"setting {name!r} is not set; {_SIGNING}")
    if verifies(settings) and not settings.security_cert_store:
        raise ConfigurationError(f"setting 'security_cert_store' is not set; {_VERIFYING}")
    if bool(settings.security_key) != bool(settings.security_certificate):
        given, other = (("security_key", "security_certificate") if settings.security_key
                        else ("security_certificate", "security_key"))
        raise ConfigurationError(
            f"setting {given!r} is set without {other!r}: a signer needs both (its PEM private key and "
            f"certificate); set {other} too, or neither"
        )


def _inner_accept(accept_content: Iterable[str]) -> set[str]:
    from kombu.serialization import registry

    types = set()
    for item in accept_content:
        if "/" in item:
            types.add(item)
        elif item != AUTH and item in registry.name_to_type:
            types.add(registry.name_to_type[item])
    return types


def _check_inner(inner: str) -> None:
    from kombu.serialization import registry

    if inner == AUTH or inner not in registry.name_to_type:
        known = ", ".join(sorted(set(registry.name_to_type) - {AUTH}))
        raise ConfigurationError(
            f"the serializer of a signed message's body must be one kombu knows other than 'auth' "
            f"(got {inner!r}); known: {known}"
        )


def build(settings: Settings, *, sign: bool = False, inner: str = "json") -> SignedSerializer:
    """The serializer the settings describe, its files read and checked now.

    :param sign: whether signing is needed even if ``task_serializer`` is not ``'auth'`` (a
        task's own serializer, or a publish that asks for it).
    :param inner: the serializer of the signed body.
    :raise ConfigurationError: ``cryptography`` is missing, a setting needed is not set, or a
        file cannot be read or used; the error names the setting and the file.
    """
    require_cryptography()
    from .certificates import load_certificate, load_store
    from .keys import load_private_key
    from .primitives import digest_for
    from .serializer import SignedSerializer

    sign = sign or signs(settings)
    _check_present(settings, sign=sign)
    _check_inner(inner)
    digest = digest_for(settings.security_digest)
    key = certificate = store = None
    if settings.security_key and settings.security_certificate:
        key = load_private_key(settings.security_key, settings.security_key_password)
        certificate = load_certificate(settings.security_certificate)
        if key.public_key().public_numbers() != certificate.public_key.public_numbers():
            raise ConfigurationError(
                f"setting 'security_certificate': the certificate in {settings.security_certificate!r} "
                f"is not the certificate of security_key {settings.security_key!r}; give the pair that "
                f"belongs together"
            )
    if settings.security_cert_store:
        store = load_store(settings.security_cert_store)
    if requires_signatures(settings) and not sign:
        logger.warning(
            "accept_content=%r accepts signed messages only, but task_serializer is %r: the messages "
            "this app sends (retries, ...) are unsigned and refused by workers that require "
            "signatures; set task_serializer='auth' with security_key and security_certificate",
            list(settings.accept_content), settings.task_serializer,
        )
    return SignedSerializer(key=key, certificate=certificate, store=store, digest=digest, inner=inner,
                            inner_accept=_inner_accept(settings.accept_content))


def register(serializer: SignedSerializer) -> None:
    """Make ``serializer`` kombu's ``auth`` serializer (one per process, as in Celery)."""
    from kombu.serialization import registry

    registry.register(AUTH, serializer.encode, serializer.loads, content_type=CONTENT_TYPE,
                      content_encoding=CONTENT_ENCODING)


def setup(settings: Settings, task_serializers: Iterable[str | None] = (), *,
          inner: str = "json") -> SignedSerializer:
    """Build the serializer for an app (``task_serializers``: its tasks' own serializers) and
    register it with kombu; what ``App.setup_security`` does.

    :raise ConfigurationError: as :func:`build`, or the settings neither sign nor verify.
    """
    serializers = list(task_serializers)
    if not is_used(settings, serializers) and not (
            settings.security_key or settings.security_certificate or settings.security_cert_store):
        raise ConfigurationError(
            "setup_security() has nothing to set up: sign messages with task_serializer='auth' (and "
            "security_key, security_certificate), require signed messages with accept_content=['auth'] "
            "(and security_cert_store)"
        )
    serializer = build(settings, sign=signs(settings, serializers), inner=inner)
    register(serializer)
    return serializer

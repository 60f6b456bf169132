"""Certificates: the signer's own (``security_certificate``) and the trusted ones that messages
are verified against (``security_cert_store``: a directory, a file or a glob pattern)."""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterator
from datetime import datetime, timezone

import attrs
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from ..exceptions import ConfigurationError, SecurityError
from ..protocol.message import safe_repr
from .files import pem_label, read_file

__all__ = ["CertStore", "Certificate", "load_certificate", "load_store", "signer_id"]

logger = logging.getLogger("worker.signing")


def signer_id(certificate: x509.Certificate) -> str:
    """How a signed message names its certificate, as Celery does: the issuer's attribute values
    and the serial number, joined by spaces."""
    values = (item.value if isinstance(item.value, str) else item.value.hex() for item in certificate.issuer)
    return f"{' '.join(values)} {certificate.serial_number}"


def shown(signer: str) -> str:
    """A signer's id for a message or log line (it comes from the message: bounded)."""
    return safe_repr(signer, 100)


@attrs.frozen
class Certificate:
    """An RSA certificate read from ``path``."""

    path: str
    x509: x509.Certificate
    public_key: rsa.RSAPublicKey
    id: str

    def __str__(self) -> str:
        """The id a message names it by, and its subject (the id names only the issuer)."""
        return f"{shown(self.id)} (subject {self.x509.subject.rfc4514_string()})"

    def problem(self, now: datetime | None = None) -> str | None:
        """Why the certificate cannot vouch for a message now (expired, not yet valid), or None."""
        now = now or datetime.now(timezone.utc)
        if now >= self.x509.not_valid_after_utc:
            return f"expired on {self.x509.not_valid_after_utc.isoformat()}"
        if now < self.x509.not_valid_before_utc:
            return f"is not valid before {self.x509.not_valid_before_utc.isoformat()}"
        return None


def _read_certificates(setting: str, path: str) -> list[Certificate]:
    data = read_file(setting, path)
    try:
        loaded = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ConfigurationError(
            f"setting {setting!r}: {path!r} holds no PEM certificate (found {pem_label(data)}); "
            + ("the store holds trusted certificates only: name a directory of them, a file, or a "
               "pattern such as /etc/worker/certs/*.pem" if setting == "security_cert_store"
               else "point it to the PEM certificate of security_key")
        ) from None
    found = []
    for certificate in loaded:
        public_key = certificate.public_key()
        if not isinstance(public_key, rsa.RSAPublicKey):
            raise ConfigurationError(
                f"setting {setting!r}: the certificate in {path!r} holds a {type(public_key).__name__}; "
                f"signed messages use RSA keys, as Celery's auth serializer does"
            )
        found.append(Certificate(path, certificate, public_key, signer_id(certificate)))
    return found


def load_certificate(path: str) -> Certificate:
    """The signer's certificate (``security_certificate``), valid now.

    :raise ConfigurationError: unreadable, not one RSA certificate, expired or not yet valid.
    """
    certificates = _read_certificates("security_certificate", path)
    if len(certificates) != 1:
        raise ConfigurationError(
            f"setting 'security_certificate': {path!r} holds {len(certificates)} certificates; it must "
            f"hold only the certificate of security_key"
        )
    certificate = certificates[0]
    problem = certificate.problem()
    if problem:
        raise ConfigurationError(
            f"setting 'security_certificate': the certificate in {path!r} {problem}; workers refuse "
            f"what it signs: renew it"
        )
    return certificate


class CertStore:
    """The trusted certificates, by signer id."""

    def __init__(self, location: str, certificates: dict[str, Certificate]) -> None:
        self.location = location
        self._by_id = certificates

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Certificate]:
        return iter(self._by_id.values())

    def __getitem__(self, signer: str) -> Certificate:
        """The certificate of ``signer``.

        :raise SecurityError: no certificate of that id is in the store.
        """
        try:
            return self._by_id[signer]
        except KeyError:
            raise SecurityError(
                f"signed by an unknown certificate {shown(signer)}: no certificate of that issuer and "
                f"serial number is in security_cert_store ({self.location}); add the signer's "
                f"certificate there to trust it"
            ) from None


def _paths(location: str) -> list[str]:
    pattern = os.path.join(location, "*") if os.path.isdir(location) else location
    return sorted(path for path in glob.glob(pattern) if not os.path.isdir(path))


def load_store(location: str) -> CertStore:
    """The certificates in ``location``: every file of a directory, one file, or the files a glob
    pattern matches. An expired certificate stays in (what it signed is refused as expired) and
    is logged.

    :raise ConfigurationError: nothing matches, a file is not a certificate, or two different
        certificates have one id.
    """
    paths = _paths(location)
    if not paths:
        raise ConfigurationError(
            f"setting 'security_cert_store': {location!r} names no file; give a directory of trusted "
            f"PEM certificates, a file, or a glob pattern such as /etc/worker/certs/*.pem"
        )
    found: dict[str, Certificate] = {}
    for path in paths:
        for certificate in _read_certificates("security_cert_store", path):
            other = found.get(certificate.id)
            if other is not None and other.x509 != certificate.x509:
                raise ConfigurationError(
                    f"setting 'security_cert_store': {other.path!r} and {path!r} hold different "
                    f"certificates with one signer id {shown(certificate.id)}; remove one"
                )
            found[certificate.id] = certificate
            problem = certificate.problem()
            if problem:
                logger.warning("security_cert_store: the certificate in %s, signer %s, %s; messages it "
                               "signs are refused", path, certificate, problem)
    return CertStore(location, found)

"""Certificates the tests make themselves: certificate authorities, server certificates for TLS
tests, and signing keys with their certificates for signed messages (all RSA, PEM files)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Authority", "Issued", "make_authority"]

_DAY = datetime.timedelta(days=1)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path, password: str | None = None) -> Path:
    encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                  else serialization.NoEncryption())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       encryption))
    path.chmod(0o600)
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@attrs.frozen
class Issued:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path
    serial: int


@attrs.frozen
class Authority:
    """A self-signed certificate authority that issues certificates into ``directory``."""

    name: str
    directory: Path
    cert: Path
    _key: rsa.RSAPrivateKey
    _certificate: x509.Certificate

    def issue(self, name: str, *, hosts: tuple[str, ...] = (), server: bool = True,
              key_password: str | None = None, expired: bool = False) -> Issued:
        """A certificate for ``name`` signed by this authority: with ``hosts`` (DNS names or IP
        addresses) as its subject alternative names for a TLS server, or a plain one (for
        signing messages); ``expired`` makes it valid only in the past."""
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = (now - 10 * _DAY, now - _DAY) if expired else (now - _DAY, now + 30 * _DAY)
        serial = x509.random_serial_number()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        if server:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        stem = self.directory / f"{self.name}-{name}".replace("/", "_")
        return Issued(cert=_write_cert(cert, stem.with_suffix(".crt")),
                      key=_write_key(key, stem.with_suffix(".key"), key_password), serial=serial)


def make_authority(directory: Path, name: str) -> Authority:
    """A new certificate authority named ``name`` whose files go in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "worker tests")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + 30 * _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert = _write_cert(certificate, directory / f"{name}-ca.crt")
    return Authority(name=name, directory=directory, cert=cert, key=key, certificate=certificate)

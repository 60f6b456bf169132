"""The signature scheme of Celery's ``auth`` serializer: RSA-PSS, MGF1 with the message digest,
the largest salt the key allows."""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ..exceptions import ConfigurationError
from ..options import did_you_mean

__all__ = ["digest_for", "sign", "signature_holds"]


def _digest_names() -> list[str]:
    names = []
    for name in dir(hashes):
        kind = getattr(hashes, name)
        if isinstance(kind, type) and issubclass(kind, hashes.HashAlgorithm) and name.isupper():
            try:
                kind()
            except TypeError:  # needs a digest size (SHAKE, BLAKE2): not a name alone
                continue
            names.append(name.lower())
    return sorted(names)


def digest_for(name: str) -> hashes.HashAlgorithm:
    """The hash algorithm ``security_digest`` names (``sha256``, ``sha512``, ...), as Celery reads it.

    :raise ConfigurationError: no such algorithm.
    """
    known = _digest_names()
    if name.lower() not in known:
        raise ConfigurationError(
            f"setting 'security_digest' names no digest (got {name!r}).{did_you_mean(name.lower(), known)} "
            f"Known: {', '.join(known)}; Celery's default is 'sha256'"
        )
    algorithm: hashes.HashAlgorithm = getattr(hashes, name.upper())()
    return algorithm


def _padding(digest: hashes.HashAlgorithm) -> padding.PSS:
    return padding.PSS(mgf=padding.MGF1(digest), salt_length=padding.PSS.MAX_LENGTH)


def sign(key: rsa.RSAPrivateKey, data: bytes, digest: hashes.HashAlgorithm) -> bytes:
    """The signature of ``data`` by ``key``."""
    return key.sign(data, _padding(digest), digest)


def signature_holds(public_key: rsa.RSAPublicKey, signature: bytes, data: bytes,
                    digest: hashes.HashAlgorithm) -> bool:
    """Whether ``signature`` is ``public_key``'s signature of ``data``."""
    try:
        public_key.verify(signature, data, _padding(digest), digest)
    except InvalidSignature:
        return False
    return True

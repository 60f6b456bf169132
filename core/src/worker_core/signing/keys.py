"""The private key that signs messages (``security_key``, ``security_key_password``)."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ..exceptions import ConfigurationError
from .files import pem_label, read_file

__all__ = ["load_private_key"]


def _encrypted(data: bytes) -> bool:
    return b"ENCRYPTED" in data[:4096]


def load_private_key(path: str, password: str | None) -> rsa.RSAPrivateKey:
    """The RSA key in the PEM file ``path``, decrypted with ``password`` when it is encrypted.

    :raise ConfigurationError: the file cannot be read, holds no key, is not RSA, or the password
        does not fit; the error names the setting and the file, never the password.
    """
    data = read_file("security_key", path)
    try:
        key = serialization.load_pem_private_key(data, password.encode("utf-8") if password else None)
    except TypeError:
        # cryptography says so when a password is missing or needless
        if password:
            raise ConfigurationError(
                f"setting 'security_key_password' is set but the key in {path!r} (security_key) is not "
                f"encrypted; remove security_key_password, or encrypt the key"
            ) from None
        raise ConfigurationError(
            f"setting 'security_key': the key in {path!r} is encrypted; set security_key_password to "
            f"its password"
        ) from None
    except ValueError:
        if password and _encrypted(data):
            raise ConfigurationError(
                f"setting 'security_key_password' does not decrypt the key in {path!r} (security_key); "
                f"check the password"
            ) from None
        raise ConfigurationError(
            f"setting 'security_key': {path!r} holds no PEM private key (found {pem_label(data)}); "
            f"point security_key to the signer's private key file"
        ) from None
    except Exception as exc:  # an unsupported algorithm or format: say which, show nothing of the key
        raise ConfigurationError(
            f"setting 'security_key': the key in {path!r} cannot be loaded ({type(exc).__name__})"
        ) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigurationError(
            f"setting 'security_key': the key in {path!r} is a {type(key).__name__}; "
            f"signed messages use RSA keys, as Celery's auth serializer does"
        )
    return key

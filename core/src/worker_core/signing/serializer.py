"""The ``auth`` serializer: signs a serialized body, and verifies one before decoding it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa
from kombu.serialization import dumps as kombu_dumps
from kombu.serialization import loads as kombu_loads

from ..exceptions import ConfigurationError, ContentDisallowed, DecodeError, SecurityError
from ..protocol.fastjson import loads as json_loads
from .certificates import Certificate, CertStore, shown
from .envelope import CONTENT_ENCODING, CONTENT_TYPE, Envelope, pack, unpack
from .primitives import sign, signature_holds

__all__ = ["SignedSerializer"]

JSON = "application/json"


class SignedSerializer:
    """Signs with ``key`` (named by ``certificate``) and verifies against ``store``; either side
    may be missing when this process only verifies or only signs.

    :param inner: the serializer of the signed body (Celery's default: json).
    :param inner_accept: content types a signed body may have (JSON always).
    """

    def __init__(self, *, key: rsa.RSAPrivateKey | None, certificate: Certificate | None,
                 store: CertStore | None, digest: hashes.HashAlgorithm, inner: str = "json",
                 inner_accept: Iterable[str] = ()) -> None:
        self.key = key
        self.certificate = certificate
        self.store = store
        self.digest = digest
        self.inner = inner
        self.inner_accept = frozenset({JSON, *inner_accept}) - {CONTENT_TYPE}

    # -- signing ---------------------------------------------------------------------------------

    def dumps(self, data: Any) -> tuple[str, str, str]:
        """Content type, content encoding and body of the signed message holding ``data``."""
        return CONTENT_TYPE, CONTENT_ENCODING, self.encode(data)

    def encode(self, data: Any) -> str:
        """The signed body (kombu's encoder)."""
        if self.key is None or self.certificate is None:
            raise ConfigurationError(
                "cannot sign a message: set security_key and security_certificate (the signer's PEM "
                "key and certificate) to send with the 'auth' serializer"
            )
        content_type, content_encoding, body = kombu_dumps(data, serializer=self.inner)
        raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        return pack(Envelope(signer=self.certificate.id, signature=sign(self.key, raw, self.digest),
                             content_type=content_type, content_encoding=content_encoding, body=raw))

    # -- verifying -------------------------------------------------------------------------------

    def loads(self, data: Any) -> Any:
        """The data a signed body holds, once its signature is verified (kombu's decoder).

        :raise SecurityError: not a signed body, unknown or expired signer, wrong signature.
        :raise ContentDisallowed: the signed body's content type is not accepted.
        :raise DecodeError: the signed body cannot be decoded.
        """
        envelope = self.verify(data)
        content_type = envelope.content_type
        if content_type not in self.inner_accept:
            raise ContentDisallowed(
                f"signed message from {shown(envelope.signer)} holds content type {content_type!r}, "
                f"which is not accepted inside signed messages (accepted: "
                f"{', '.join(sorted(self.inner_accept))})"
            )
        try:
            if content_type == JSON:
                return json_loads(envelope.body.decode(envelope.content_encoding or "utf-8"))
            return kombu_loads(envelope.body, content_type, envelope.content_encoding,
                               accept=self.inner_accept)
        except RecursionError:
            raise DecodeError(f"signed body cannot be decoded as {content_type}: nested too deeply") from None
        except Exception as exc:
            raise DecodeError(
                f"signed body cannot be decoded as {content_type}: {type(exc).__name__}: {exc}"
            ) from None

    def verify(self, data: Any) -> Envelope:
        """The envelope ``data`` holds, its signature checked.

        :raise SecurityError: as :meth:`loads`.
        """
        if self.store is None:
            raise SecurityError(
                "cannot verify a signed message: set security_cert_store to the trusted certificates"
            )
        envelope = unpack(data)
        certificate = self.store[envelope.signer]
        problem = certificate.problem()
        if problem:
            raise SecurityError(
                f"signed by certificate {certificate}, which {problem}; the signer needs a renewed "
                f"certificate in security_cert_store"
            )
        if not signature_holds(certificate.public_key, envelope.signature, envelope.body, self.digest):
            raise SecurityError(
                f"bad signature from {certificate}: the body was changed after it was signed, or signed "
                f"with another key or digest (security_digest={self.digest.name!r})"
            )
        return envelope


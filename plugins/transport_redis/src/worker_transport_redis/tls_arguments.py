"""redis-py's SSL arguments (``ssl_cert_reqs``, ``ssl_ca_certs``, ...): each value checked and put
in the form redis-py takes, whether it came from a URL's query (text) or from a setting."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ARGUMENTS", "CERT_REQS", "Invalid", "check_argument", "url_text"]

#: Celery's spellings of ``ssl_cert_reqs`` (kombu reads the same ones in a URL), as redis-py's
CERT_REQS: Mapping[str, str] = {
    "required": "required", "optional": "optional", "none": "none",
    "CERT_REQUIRED": "required", "CERT_OPTIONAL": "optional", "CERT_NONE": "none",
}
_BY_MODE: Mapping[int, str] = {ssl.CERT_REQUIRED: "required", ssl.CERT_OPTIONAL: "optional",
                               ssl.CERT_NONE: "none"}
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


class Invalid(Exception):
    """A value that does not fit its argument: what was expected instead, and why not if the
    kind of value was right."""

    def __init__(self, expected: str, reason: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.reason = reason


def _cert_reqs(value: Any, from_url: bool) -> str:
    if isinstance(value, str) and value in CERT_REQS:
        return CERT_REQS[value]
    # ssl.CERT_* are ints (ssl.VerifyMode); a URL's text is not, and kombu reads the URL too
    if not from_url and isinstance(value, int) and not isinstance(value, bool) and value in _BY_MODE:
        return _BY_MODE[value]
    spellings = ", ".join(map(repr, CERT_REQS))
    raise Invalid(f"one of {spellings}" + ("" if from_url else " or ssl.CERT_REQUIRED, ssl.CERT_OPTIONAL, "
                                           "ssl.CERT_NONE"))


def _flag(value: Any, from_url: bool) -> bool:
    if isinstance(value, bool):
        return value
    if from_url and isinstance(value, str) and value.lower() in (*_TRUE, *_FALSE):
        return value.lower() in _TRUE
    raise Invalid("true or false" if from_url else "True or False")


def _path(kind: str, exists: Callable[[str], bool]) -> Callable[[Any, bool], str]:
    def check(value: Any, from_url: bool) -> str:
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise Invalid(f"the path of a {kind}")
        path = str(os.fspath(value))
        # Checked now: at connection time a missing file is one more "cannot connect" retry line.
        if not exists(path) or not os.access(path, os.R_OK):
            raise Invalid(f"the path of a readable {kind}", f"there is no readable {kind} there")
        return path

    return check


def _text(value: Any, from_url: bool) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid("a non-empty string")
    return value


def _pem(value: Any, from_url: bool) -> str | bytes:
    if not isinstance(value, (str, bytes)) or not value:
        raise Invalid("PEM text (str) or DER bytes of CA certificates")
    return value


def _tls_version(value: Any, from_url: bool) -> ssl.TLSVersion:
    if isinstance(value, ssl.TLSVersion):
        return value
    if isinstance(value, str) and value in ssl.TLSVersion.__members__:
        return ssl.TLSVersion[value]
    number = int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else value
    if isinstance(number, int) and not isinstance(number, bool) and number in set(ssl.TLSVersion):
        return ssl.TLSVersion(number)
    names = ", ".join(name for name in ssl.TLSVersion.__members__ if name.startswith("TLS"))
    raise Invalid(f"an ssl.TLSVersion, or its name ({names})")


def _verify_flags(value: Any, from_url: bool) -> list[ssl.VerifyFlags]:
    items = value.split(",") if from_url and isinstance(value, str) else value
    if isinstance(items, (list, tuple)):
        flags = [ssl.VerifyFlags[item.strip()] if isinstance(item, str) and item.strip()
                 in ssl.VerifyFlags.__members__ else item for item in items]
        checked = [flag for flag in flags if isinstance(flag, ssl.VerifyFlags)]
        if len(checked) == len(flags):
            return checked
    raise Invalid("a list of ssl.VerifyFlags (or their names, comma-separated in a URL)")


def _any(value: Any, from_url: bool) -> Any:
    return value


#: Every SSL argument redis-py's ``SSLConnection`` takes, with its check and an example value.
ARGUMENTS: Mapping[str, tuple[Callable[[Any, bool], Any], Any]] = {
    "ssl_cert_reqs": (_cert_reqs, "required"),
    "ssl_check_hostname": (_flag, True),
    "ssl_ca_certs": (_path("file", os.path.isfile), "/etc/ssl/certs/ca.pem"),
    "ssl_ca_path": (_path("directory", os.path.isdir), "/etc/ssl/certs"),
    "ssl_ca_data": (_pem, "-----BEGIN CERTIFICATE-----..."),
    "ssl_certfile": (_path("file", os.path.isfile), "/etc/ssl/client.pem"),
    "ssl_keyfile": (_path("file", os.path.isfile), "/etc/ssl/client.key"),
    "ssl_password": (_text, "the key's password"),
    "ssl_ciphers": (_text, "ECDHE+AESGCM"),
    "ssl_min_version": (_tls_version, "TLSv1_2"),
    "ssl_include_verify_flags": (_verify_flags, ["VERIFY_X509_STRICT"]),
    "ssl_exclude_verify_flags": (_verify_flags, ["VERIFY_X509_STRICT"]),
    "ssl_validate_ocsp": (_flag, True),
    "ssl_validate_ocsp_stapled": (_flag, True),
    "ssl_ocsp_context": (_any, None),
    "ssl_ocsp_expected_cert": (_any, None),
}


def check_argument(name: str, value: Any, from_url: bool) -> Any:
    """``value`` of the SSL argument ``name`` as redis-py takes it; raises :class:`Invalid`.
    ``name`` must be one of :data:`ARGUMENTS`."""
    check, _example = ARGUMENTS[name]
    return check(value, from_url)


def url_text(value: Any) -> str:
    """How an example value is written in a URL's query."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)

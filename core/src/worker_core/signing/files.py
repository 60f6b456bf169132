"""Reading the PEM files the ``security_*`` settings name, with errors that name the setting."""

from __future__ import annotations

from ..exceptions import ConfigurationError

__all__ = ["pem_label", "read_file"]


def read_file(setting: str, path: str) -> bytes:
    """The contents of ``path``, named by ``setting``.

    :raise ConfigurationError: the file cannot be read; says which setting, file and why.
    """
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigurationError(
            f"setting {setting!r}: cannot read {path!r}: {exc.strerror or exc}"
        ) from None


def pem_label(data: bytes) -> str:
    """What a file holds by its first PEM header (``CERTIFICATE``, ``PRIVATE KEY``, ...), without
    showing anything else of it: a key file's contents are secret."""
    start = data.find(b"-----BEGIN ")
    if start < 0:
        return "no PEM block"
    end = data.find(b"-----", start + 11)
    label = data[start + 11:end] if end > 0 else b""
    if not label or len(label) > 40 or not label.replace(b" ", b"").isalnum():
        return "no PEM block"
    return f"a PEM {label.decode('ascii')}"

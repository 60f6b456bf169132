"""The ``cryptography`` package: signing needs it and nothing else does, so it is imported only
when messages are signed or verified, and its absence names the ``pip install`` that adds it."""

from __future__ import annotations

from ..exceptions import ConfigurationError

__all__ = ["require_cryptography"]


def require_cryptography() -> None:
    """:raise ConfigurationError: ``cryptography`` is not installed."""
    try:
        import cryptography  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            f"signed messages (task_serializer='auth', or 'auth' in accept_content) need the "
            f"cryptography package, which cannot be imported ({exc}); install it with "
            f"pip install './core[auth]' (from a checkout of this repository)"
        ) from None

"""The async event loop on kombu's hub."""

from __future__ import annotations

from typing import ClassVar


class AsyncLoop:
    uses_hub: ClassVar[bool] = True

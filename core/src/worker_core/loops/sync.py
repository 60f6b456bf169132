"""The sync event loop: blocking ``drain_events`` with a timeout."""

from __future__ import annotations

from typing import ClassVar


class SyncLoop:
    uses_hub: ClassVar[bool] = False

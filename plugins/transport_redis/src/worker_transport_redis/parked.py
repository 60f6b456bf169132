"""A message the worker holds for its ETA, kept by the QoS in the worker's packed form
(:class:`worker_core.slots.ParksMessages`) instead of as a whole kombu message: what the channel
reads of a message it still holds, to put a copy back, is unpacked when it is read."""

from __future__ import annotations

from typing import Any

from worker_core.protocol.packing import unpack

__all__ = ["Parked"]


class Parked:
    """A delivered message, packed: its kombu envelope, tag and delivery info."""

    __slots__ = ("envelope",)

    def __init__(self, envelope: bytes) -> None:
        self.envelope = envelope

    @property
    def unpacked(self) -> Any:
        """The kombu envelope, as the message held it (read through ``internals.envelope_of``)."""
        return unpack(self.envelope)

    @property
    def delivery_info(self) -> Any:
        return self.unpacked["properties"]["delivery_info"]

    @property
    def delivery_tag(self) -> Any:
        return self.unpacked["properties"]["delivery_tag"]

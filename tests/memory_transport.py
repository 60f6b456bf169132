"""A transport that keeps its messages in this process's memory, written as a third party writes
one: on the public API alone (the ``Transport`` slot of :mod:`worker_core.slots`, the errors of
:mod:`worker_core.exceptions`, :class:`worker_core.Settings`), over kombu's in-memory transport
with a broker of its own that, as a broker does, gives back what a closed connection had not
acknowledged (kombu's own drops it).

It is the proof that a transport needs no change to the core: ``tests/test_memory_transport.py``
runs the shipped contract suite (:mod:`worker_core.testing.transport_contract`) against it, and
``tests/test_public_api.py`` reads its imports as it reads the built-in plugins'. Its queues live
as long as the process, shared by every connection made in it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from queue import Queue
from typing import TYPE_CHECKING, Any, ClassVar

from kombu.exceptions import ChannelError
from kombu.transport import memory, virtual

from worker_core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from worker_core import Settings
    from worker_core.slots import Transport

__all__ = ["MemoryTransport"]

SCHEME = "memory"


class Channel(memory.Channel):  # type: ignore[misc]
    """kombu's in-memory channel on queues of this transport's own, giving back on close what it
    delivered and nobody acknowledged, flagged as delivered again."""

    queues: ClassVar[dict[str, Queue[Any]]] = {}
    events: ClassVar[defaultdict[str, set[Any]]] = defaultdict(set)
    do_restore = True

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = super()._get(queue, timeout)
        if payload.get("redelivered"):  # (kombu's restore marks the message, not its delivery)
            payload["properties"].setdefault("delivery_info", {})["redelivered"] = True
        return payload


class KombuTransport(memory.Transport):  # type: ignore[misc]
    """The kombu transport class, with its exchanges and bindings apart from kombu's ``memory://``."""

    Channel = Channel
    global_state = virtual.BrokerState()


class MemoryTransport:
    """``memory://``: kombu's in-memory transport, whose broker is this process."""

    #: drained by the sync loop: kombu's in-memory channel has no descriptor to poll
    supports_async: ClassVar[bool] = False

    def __init__(self, url: str, settings: Settings) -> None:
        scheme, _, rest = url.partition("://")
        if scheme != SCHEME or rest.strip("/"):
            raise ConfigurationError(f"the memory transport takes the URL {SCHEME}:// alone (got {url!r})")
        self.url = url
        options = settings.broker_transport_options
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"broker_transport_options must be a mapping (got {options!r})")
        self.options = dict(options)

    def kombu_transport(self) -> type:
        return KombuTransport

    def connection_options(self) -> dict[str, Any]:
        return {"transport_options": dict(self.options)}

    def queue_depth(self, connection: Any, queue: str) -> int:
        """Messages waiting in ``queue`` (a passive declare; 0 when it does not exist)."""
        try:
            return int(connection.default_channel.queue_declare(queue=queue, passive=True).message_count)
        except ChannelError:
            return 0


if TYPE_CHECKING:
    # mypy proves the class satisfies the slot's Protocol
    _TRANSPORT: type[Transport] = MemoryTransport

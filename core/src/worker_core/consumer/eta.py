"""Tasks held for their ETA or countdown, each in a compact form until it comes due.

A held task keeps only what finds it (its id), orders it (its ETA) and acknowledges it (its
channel and delivery tag), and its message packed (:mod:`~worker_core.protocol.packing`): not
its request, decoded envelope or kombu message, about 6 KiB where this keeps a few hundred bytes.
Its request is built again from the message when it comes due, is revoked, or is listed by
``inspect scheduled``. A channel that keeps delivered messages itself (kombu's virtual transports)
and can park them (:class:`~worker_core.slots.ParksMessages`) keeps the packed form too. One timer
entry serves them all, for the earliest.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

from kombu.message import Message as KombuMessage

from ..protocol import decode_task
from ..protocol.packing import PackError, pack, unpack
from ..slots import ParksMessages
from ..transports.message import Message as VirtualMessage

if TYPE_CHECKING:
    from kombu.message import Message

    from ..app.task import Task
    from ..request import Request
    from .consumer import Consumer

__all__ = ["EtaHold", "HeldTask"]

logger = logging.getLogger("worker.consumer")

#: most held tasks handed on per timer call (the loop then turns; the rest follow at once)
_DUE_PER_CALL = 500

#: builds a request: ``(consumer, message, envelope, task)``
MakeRequest = Callable[..., "Request"]


class HeldTask:
    """One task held for its ETA: its id, its ETA (seconds since the epoch) and its message,
    packed, or its whole request when the message cannot be packed."""

    __slots__ = ("channel", "envelope", "eta", "id", "kept", "marks", "tag", "task")

    def __init__(self, eta: float, request: Request) -> None:
        message = request.message
        self.eta = eta
        self.id = request.id
        self.task: Task = request.task
        self.channel: Any = message.channel
        self.tag: Any = message.delivery_tag
        #: what the poison cap noted on the request (see :meth:`request`), in one small number
        self.marks = request.deliveries * 2 + request.count_at_start
        #: the message packed: its kombu virtual envelope (``envelope``), or the fields of a
        #: kombu message; or the request itself when the message cannot be packed
        self.kept: bytes | Request = request
        self.envelope = isinstance(message, VirtualMessage)
        try:
            if isinstance(message, VirtualMessage):
                self.kept = pack(message._raw)  # (its body as it came: built again the same way)
            elif message.headers.get("compression"):
                return  # kombu undid the compression as it built the message: keep it built
            else:
                self.kept = pack((message.body, message.content_type, message.content_encoding,
                                  dict(message.delivery_info), dict(message.properties),
                                  dict(message.headers)))
        except PackError as exc:
            logger.debug("Task %s is held whole: %s", request.label, exc)
            return
        if self.envelope and isinstance(self.channel, ParksMessages):
            self.channel.park_message(self.tag, self.kept)

    def __lt__(self, other: HeldTask) -> bool:
        return self.eta < other.eta

    def message(self) -> Message:
        """A kombu message as it was delivered (the same channel and delivery tag)."""
        kept = self.kept
        if not isinstance(kept, bytes):
            return kept.message
        if self.envelope:
            message: Message = self.channel.message_to_python(unpack(kept))
            return message
        body, content_type, content_encoding, info, properties, headers = unpack(kept)
        return KombuMessage(
            body=body, delivery_tag=self.tag, content_type=content_type, content_encoding=content_encoding,
            delivery_info=info, properties=properties, headers=headers, channel=self.channel,
        )

    def request(self, consumer: Consumer, make_request: MakeRequest, accept: frozenset[str]) -> Request:
        """The task's request, built again (it was decoded once: it decodes the same way)."""
        kept = self.kept
        if not isinstance(kept, bytes):
            return kept
        message = self.message()
        envelope = decode_task(message.headers, message.properties, message.body, message.content_type,
                               message.content_encoding, accept=accept,
                               max_size=consumer.app.settings.worker_max_message_size)
        request = make_request(consumer, message, envelope, self.task)
        request.deliveries, counted = divmod(self.marks, 2)
        request.count_at_start = bool(counted)
        return request


class EtaHold:
    """The held tasks, earliest first, and the one timer entry for the earliest."""

    def __init__(self, timer: Any, due: Callable[[HeldTask], None]) -> None:
        self.timer = timer
        #: called with each held task that came due, in ETA order (taken out first)
        self.due = due
        self._heap: list[HeldTask] = []
        self._entry: Any = None
        self._entry_eta = 0.0

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[HeldTask]:
        return iter(sorted(self._heap))

    def __contains__(self, task_id: object) -> bool:
        return any(held.id == task_id for held in self._heap)

    def add(self, held: HeldTask) -> None:
        heapq.heappush(self._heap, held)
        if self._heap[0] is held:
            self._schedule()

    def take(self, task_ids: Collection[str]) -> list[HeldTask]:
        """Take out the held tasks with these ids. Returns them."""
        found = [held for held in self._heap if held.id in task_ids]
        if found:
            taken = set(map(id, found))
            self._heap = [held for held in self._heap if id(held) not in taken]
            heapq.heapify(self._heap)
            self._schedule()
        return found

    def clear(self) -> list[HeldTask]:
        """Take out every held task. Returns them, earliest first."""
        held = sorted(self._heap)
        self._heap = []
        self._schedule()
        return held

    def _schedule(self) -> None:
        """One timer entry, for the earliest held task (none when nothing is held)."""
        heap = self._heap
        if self._entry is not None:
            if heap and self._entry_eta == heap[0].eta:
                return
            self._entry.cancel()
            self._entry = None
        if heap:
            self._entry_eta = heap[0].eta
            self._entry = self.timer.call_after(max(heap[0].eta - time.time(), 0.0), self._fire)

    def _fire(self) -> None:
        self._entry = None
        heap = self._heap
        now = time.time()
        for _ in range(_DUE_PER_CALL):
            if not heap or heap[0].eta > now:
                break
            self.due(heapq.heappop(heap))
        self._schedule()

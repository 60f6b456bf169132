"""Tasks held for their ETA or countdown, each in a compact form until it comes due.

A held task keeps only what finds it (its id), orders it (its ETA) and acknowledges it (its
channel and delivery tag), and its message packed (:mod:`~worker_core.protocol.packing`): not
its request, decoded envelope or kombu message, about 6 KiB where this keeps a few hundred bytes.
Its request is built again from the message when it comes due, is revoked, or is listed by
``inspect scheduled``. A channel that keeps delivered messages itself (kombu's virtual transports)
and can park them (:class:`~worker_core.slots.ParksMessages`) keeps the packed form too. One timer
entry serves them all, for the earliest.

Each waits on the monotonic clock, for a deadline the consumer's :class:`~.clock.Clock` gives it
(the broker's clock when the transport tells it): a step of the wall clock moves none of them until
the clock sees the jump, and then :meth:`EtaHold.rearm` sets them again at once.
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

__all__ = ["EtaHold", "HeldTask"]

logger = logging.getLogger("worker.consumer")

#: most held tasks handed on per timer call (the loop then turns; the rest follow at once)
_DUE_PER_CALL = 500

#: builds a request: ``(message, envelope, task)``
MakeRequest = Callable[..., "Request"]


class HeldTask:
    """One task held for its ETA: its id, its ETA (seconds since the epoch), when that is on the
    monotonic clock (``deadline``) and its message, packed, or its whole request when the message
    cannot be packed."""

    __slots__ = ("channel", "deadline", "envelope", "eta", "id", "kept", "marks", "tag", "task")

    def __init__(self, eta: float, request: Request, deadline: float | None = None) -> None:
        message = request.message
        self.eta = eta
        self.deadline = time.monotonic() + eta - time.time() if deadline is None else deadline
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
        return self.deadline < other.deadline

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

    def request(self, make_request: MakeRequest, accept: frozenset[str], max_size: int) -> Request:
        """The task's request, built again (it was decoded once: it decodes the same way) with
        ``make_request(message, envelope, task)``."""
        kept = self.kept
        if not isinstance(kept, bytes):
            return kept
        message = self.message()
        envelope = decode_task(message.headers, message.properties, message.body, message.content_type,
                               message.content_encoding, accept=accept, max_size=max_size)
        request = make_request(message, envelope, self.task)
        request.deliveries, counted = divmod(self.marks, 2)
        request.count_at_start = bool(counted)
        return request


class EtaHold:
    """The held tasks, earliest first, and the one timer entry for the earliest."""

    def __init__(self, timer: Any, due: Callable[[HeldTask], None],
                 deadline: Callable[[float], float] | None = None) -> None:
        self.timer = timer
        #: called with each held task that came due, in ETA order (taken out first)
        self.due = due
        #: an ETA (seconds since the epoch) -> when it is, on the monotonic clock
        self.deadline = deadline or (lambda eta: time.monotonic() + eta - time.time())
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

    def hold(self, eta: float, request: Request) -> None:
        """Hold ``request`` until ``eta`` (seconds since the epoch)."""
        self.add(HeldTask(eta, request, self.deadline(eta)))

    def rearm(self) -> None:
        """Set every held task's deadline again from its ETA (the clock jumped), and the timer."""
        for held in self._heap:
            held.deadline = self.deadline(held.eta)
        heapq.heapify(self._heap)
        if self._entry is not None:
            self._entry.cancel()
            self._entry = None
        self._schedule()

    def take_tags(self, tags: Collection[Any]) -> list[HeldTask]:
        """Take out the held tasks whose message has one of these delivery tags. Returns them."""
        return self._take_where(lambda held: held.tag in tags)

    def take(self, task_ids: Collection[str]) -> list[HeldTask]:
        """Take out the held tasks with these ids. Returns them."""
        return self._take_where(lambda held: held.id in task_ids)

    def _take_where(self, chosen: Callable[[HeldTask], bool]) -> list[HeldTask]:
        found = [held for held in self._heap if chosen(held)]
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
            if heap and self._entry_eta == heap[0].deadline:
                return
            self._entry.cancel()
            self._entry = None
        if heap:
            self._entry_eta = heap[0].deadline
            self._entry = self.timer.call_after(max(heap[0].deadline - time.monotonic(), 0.0), self._fire)

    def _fire(self) -> None:
        self._entry = None
        heap = self._heap
        now = time.monotonic()
        for _ in range(_DUE_PER_CALL):
            if not heap or heap[0].deadline > now:
                break
            self.due(heapq.heappop(heap))
        self._schedule()

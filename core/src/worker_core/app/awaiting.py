"""Sending tasks and waiting for their results from async code (FastAPI, aiohttp, Django async
views) without blocking its event loop: ``await task.adelay(...)``, ``await
task.aapply_async(...)``, ``await app.asend_task(...)``, then ``await result.aget(timeout=...)``
(or ``await result``).

The client's calls are synchronous (kombu, the result backends), so they run in threads of the
app's own: every send in one thread (its broker connection, and for ``rpc://`` its reply queue,
are that thread's), and each wait in one of a bounded set of threads, in slices of at most a
second so that a wait the caller gave up on (a cancelled request) frees its thread soon. A result
on ``rpc://`` is read by the sending thread, the only one its replies reach: each awaiting
coroutine asks it again with a growing pause, at most ``interval`` seconds.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import ResultTimeout
from ..results.meta import READY_STATES
from ..slots import RepliesToSender

if TYPE_CHECKING:
    from .base import App

__all__ = ["MAX_WAITING_THREADS", "AsyncClient", "client_of", "close_client"]

T = TypeVar("T")

#: at most this many results are waited for at once (the others wait for a thread)
MAX_WAITING_THREADS = 100
#: the longest one blocking read of a result lasts, so a cancelled wait frees its thread soon
SLICE = 1.0

_clients: dict[int, AsyncClient] = {}
_lock = threading.Lock()


def client_of(app: App) -> AsyncClient:
    """The app's async client in this process (a forked child makes its own)."""
    with _lock:
        client = _clients.get(id(app))
        if client is None or client.pid != os.getpid() or client.app is not app:
            client = _clients[id(app)] = AsyncClient(app)
        return client


def close_client(app: App) -> None:
    """Stop the app's async client threads in this process, if it has any (``app.close()``)."""
    with _lock:
        client = _clients.pop(id(app), None)
    if client is not None and client.pid == os.getpid():
        client.close()


class AsyncClient:
    def __init__(self, app: App) -> None:
        self.app = app
        self.pid = os.getpid()
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-async-send")
        self._waiters = ThreadPoolExecutor(max_workers=MAX_WAITING_THREADS,
                                           thread_name_prefix="worker-async-wait")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the sending thread, in the caller's context (a task sent
        by a running task is its child), awaited."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        return await loop.run_in_executor(self._sender, lambda: context.run(fn, *args, **kwargs))

    async def wait(self, task_id: str, timeout: float | None, interval: float) -> Mapping[str, Any]:
        """The ready meta of ``task_id``, awaited; ``ResultTimeout`` after ``timeout`` seconds."""
        backend = self.app.backend
        deadline = None if timeout is None else monotonic() + timeout
        if isinstance(backend, RepliesToSender):
            return await self._poll(task_id, deadline, interval)
        given_up = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._waiters, self._wait_in_slices, task_id, deadline,
                                              interval, given_up)
        finally:
            given_up.set()

    def _wait_in_slices(self, task_id: str, deadline: float | None, interval: float,
                        given_up: threading.Event) -> Mapping[str, Any]:
        backend = self.app.backend
        while True:
            left = None if deadline is None else deadline - monotonic()
            if given_up.is_set():
                raise ResultTimeout(f"the wait for task {task_id} was given up")
            if left is not None and left <= 0:
                raise ResultTimeout(f"task {task_id} was not ready within the timeout")
            try:
                return backend.wait_for(task_id, timeout=SLICE if left is None else min(left, SLICE),
                                        interval=interval)
            except ResultTimeout:
                continue

    async def _poll(self, task_id: str, deadline: float | None, interval: float) -> Mapping[str, Any]:
        pause = 0.005
        backend = self.app.backend
        while True:
            meta = await self.call(backend.get_task_meta, task_id)
            if meta.get("status") in READY_STATES:
                return meta
            left = None if deadline is None else deadline - monotonic()
            if left is not None and left <= 0:
                raise ResultTimeout(f"task {task_id} was not ready within the timeout (its last state: "
                                    f"{meta.get('status')})")
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, interval)

    def close(self) -> None:
        self._sender.shutdown(wait=False)
        self._waiters.shutdown(wait=False)

"""A wake-up pipe's numbers are never written to or closed once the pipe is closed: the kernel
hands a freed number to the next file the process opens (a broker's socket, a child's pipe), and
a byte written to it or a close of it would land there. The loop's inbox, the prefork pool's
selector driver and the Redis Cluster result listener each own such a pipe; each is closed here
and its freed numbers handed to pipes of the test's own, which must stay untouched."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu.asynchronous import Hub

from worker_core.consumer.inbox import Inbox
from worker_pool_prefork.drivers.selector import SelectorDriver
from worker_transport_redis_cluster.listener import ResultListener


def open_fds() -> set[int]:
    listed = {int(name) for name in os.listdir("/proc/self/fd")}
    return {fd for fd in listed if is_open(fd)}  # not the one the listing itself had open


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class Squatters:
    """Pipes of the test's own moved onto freed descriptor numbers, as the kernel would hand
    those numbers to the next files opened."""

    def __init__(self) -> None:
        #: each freed number taken -> the read end of the pipe now written to through it
        self.pipes: dict[int, int] = {}

    def take(self, number: int) -> None:
        # the new pipe's own numbers are moved out of the way first: the lowest free numbers,
        # which it would get, are the freed ones
        read, write = (self._high(fd) for fd in os.pipe())
        os.set_blocking(read, False)
        os.dup2(write, number)
        os.close(write)
        self.pipes[number] = read

    @staticmethod
    def _high(fd: int) -> int:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 512)
        os.close(fd)
        return moved

    def written(self) -> dict[int, bytes]:
        found = {}
        for number, read in self.pipes.items():
            try:
                found[number] = os.read(read, 4096)
            except BlockingIOError:
                pass
        return found

    def closed(self) -> list[int]:
        return [number for number in self.pipes if not is_open(number)]

    def close(self) -> None:
        for number, read in self.pipes.items():
            for fd in (read, number):
                try:
                    os.close(fd)
                except OSError:
                    pass


@pytest.fixture
def squatters() -> Iterator[Squatters]:
    taken = Squatters()
    yield taken
    taken.close()


def made(factory: Callable[[], Any]) -> tuple[Any, set[int]]:
    """What ``factory`` makes, and the descriptors it opened."""
    before = open_fds()
    thing = factory()
    return thing, open_fds() - before


def installed(inbox: Inbox, hub: Hub) -> Inbox:
    inbox.install(hub)
    return inbox


def test_the_selector_driver_writes_no_wake_up_once_closed(squatters: Squatters) -> None:
    driver, opened = made(SelectorDriver)
    driver.start_thread("descriptor-lifetimes")
    driver.request_stop()
    assert driver.wait_loop_exit(10), "the driver's thread did not leave its loop"
    driver.thread.join(10)
    driver.close()
    for number in opened:
        squatters.take(number)

    driver.call_soon(print, "never run")  # from a thread that is not the driver's: it wakes the loop

    assert squatters.written() == {}


def test_a_wake_up_during_the_inbox_close_writes_nothing(squatters: Squatters,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    hub = Hub()
    inbox, opened = made(lambda: installed(Inbox(), hub))
    assert len(opened) == 2, "the inbox opens its wake-up pipe when installed"
    really_close = os.close
    pipe = set(opened)

    def close_then_signal(fd: int) -> None:
        really_close(fd)
        if fd in pipe:
            pipe.discard(fd)
            squatters.take(fd)
            inbox.wake()  # what a signal handler does, arriving while the pipe is being closed

    monkeypatch.setattr(os, "close", close_then_signal)
    inbox.close()
    monkeypatch.undo()
    inbox.wake()
    inbox.call(print, "never run")  # the loop's thread runs it at once; no pipe is needed

    assert sorted(squatters.pipes) == sorted(opened)
    assert squatters.written() == {}
    hub.close()


def test_the_cluster_result_listener_closes_its_pipe_once(squatters: Squatters) -> None:
    # no cluster is needed: nothing is subscribed before the listener closes
    listener, opened = made(lambda: ResultListener(router=None, sharded=False, decode=json.loads))
    assert len(opened) == 2, "the listener opens its wake-up pipe when made"
    listener.close()
    for number in opened:
        squatters.take(number)

    listener.close()
    listener.subscribe("celery-task-meta-never", early=True)

    assert squatters.closed() == []
    assert squatters.written() == {}

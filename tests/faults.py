"""Broker faults the tests control: a private redis-server on a free port, and a TCP proxy in
front of a shared broker that can cut, blackhole and restore connections."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), 0.5).close()
        return True
    except OSError:
        return False


class RedisServer:
    """A redis-server of our own (never the shared one), stopped by its PID."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not answers(self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; ``cut()`` drops every connection and refuses new
    ones until ``restore()``; ``blackhole()`` keeps connections open but forwards nothing."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        self.accepting = True
        self.forwarding = True
        self.closed = False
        self.wake_r, self.wake_w = os.pipe()
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._pump, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.accepting:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, 5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.pairs.append((client, upstream))
            os.write(self.wake_w, b"x")

    def _pump(self) -> None:
        while not self.closed:
            if not self.forwarding:
                time.sleep(0.05)
                continue
            with self.lock:
                sockets = [s for pair in self.pairs for s in pair]
            try:
                readable, _, _ = select.select([*sockets, self.wake_r], [], [], 0.2)
            except (OSError, ValueError):
                continue
            for sock in readable:
                if sock == self.wake_r:
                    os.read(self.wake_r, 1024)
                    continue
                if not self.forwarding:
                    continue
                peer = self._peer(sock)
                if peer is None:
                    continue
                try:
                    data = sock.recv(65536)
                    if not data:
                        raise OSError("closed")
                    peer.sendall(data)
                except OSError:
                    self._drop(sock)

    def _peer(self, sock: socket.socket) -> socket.socket | None:
        with self.lock:
            for client, upstream in self.pairs:
                if sock is client:
                    return upstream
                if sock is upstream:
                    return client
        return None

    def _drop(self, sock: socket.socket) -> None:
        with self.lock:
            for pair in list(self.pairs):
                if sock in pair:
                    self.pairs.remove(pair)
                    _close_all(pair)

    def cut(self) -> None:
        """Drop every connection and refuse new ones (the broker looks down)."""
        self.accepting = False
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            _close_all(pair)

    def blackhole(self) -> None:
        """Keep connections open but forward nothing (a hung network)."""
        self.forwarding = False

    def restore(self) -> None:
        self.accepting = True
        self.forwarding = True
        os.write(self.wake_w, b"x")

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.listener.close()


def _close_all(sockets: Iterable[socket.socket]) -> None:
    for each in sockets:
        try:
            each.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        each.close()

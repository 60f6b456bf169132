"""A TCP proxy put between a client and a real broker, so a check can lose the connection the way a
network does (``cut``), hang it (``blackhole``), hang only the connections open now (``freeze``)
and let traffic through again (``restore``)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy", "proxied"]


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``(host, port)``; :meth:`cut` drops every connection and
    refuses new ones until :meth:`restore`; :meth:`blackhole` keeps connections open but forwards
    nothing until :meth:`restore`; :meth:`freeze` does that to the connections open now only, as
    a NAT or firewall that forgot them, while new ones go through. ``client_data``, if given, is
    called with each chunk a client sends, before it is forwarded; it may block to hold that
    connection's traffic back."""

    def __init__(self, host: str, port: int, client_data: Callable[[bytes], None] | None = None) -> None:
        self.target = (host, port)
        self._client_data = client_data
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._frozen: set[tuple[socket.socket, socket.socket]] = set()
        self._lock = threading.Lock()
        self._accepting = True
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._closed = False
        threading.Thread(target=self._accept, name="contract-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._accepting:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, 5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        pair = (client, upstream)
        try:
            while not self._closed:
                self._forwarding.wait()
                if pair in self._frozen:
                    time.sleep(0.05)
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.2)
                for sock in readable:
                    if not self._forwarding.is_set() or pair in self._frozen:
                        break
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client and self._client_data is not None:
                        self._client_data(data)
                    peers[sock].sendall(data)
        except (OSError, ValueError):  # cut() closed the sockets under us
            return
        finally:
            self._drop((client, upstream))

    def _drop(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
            self._frozen.discard(pair)
        for sock in pair:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> None:
        """Drop every connection through the proxy, and refuse new ones."""
        self._accepting = False
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._drop(pair)

    def blackhole(self) -> None:
        """Keep every connection open but forward nothing (a hung network)."""
        self._forwarding.clear()

    def freeze(self, server_side_port: int | None = None) -> None:
        """Forward nothing more on the connections open now (only the one whose port the server
        sees is ``server_side_port``, when given), and let new ones through: those connections
        look open to their clients and stay silent."""
        with self._lock:
            for pair in self._pairs:
                if server_side_port is None or pair[1].getsockname()[1] == server_side_port:
                    self._frozen.add(pair)

    def restore(self) -> None:
        """Let new connections and traffic through again."""
        with self._lock:
            self._frozen.clear()
        self._accepting = True
        self._forwarding.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._forwarding.set()  # held pumps wake, find their sockets closed and end
        self._listener.close()


@contextlib.contextmanager
def proxied(url: str, default_port: int | None = None) -> Iterator[tuple[TcpProxy, str] | None]:
    """A proxy in front of the server ``url`` names and the same URL through it, or ``None`` when
    the URL names no host (a broker in a local file needs no network). A URL naming several
    hosts (``h1:6379,h2:6379``, as cluster and libpq URLs do) gets the proxy in front of its first
    host, the others kept as they are."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    first, comma, others = hosts.partition(",")
    single = urlsplit(f"{parts.scheme}://{first}")
    port = single.port or default_port
    if not single.hostname or not port:
        yield None
        return
    proxy = TcpProxy(single.hostname, port)
    netloc = f"{userinfo}{at}127.0.0.1:{proxy.port}{comma}{others}"
    try:
        yield proxy, urlunsplit(parts._replace(netloc=netloc))
    finally:
        proxy.close()

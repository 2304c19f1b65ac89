"""A TCP proxy on 127.0.0.1 that can turn into a black hole: a server that stops answering.

It forwards every connection to a real server until `blackhole()`; from then
on it keeps every connection open, accepts new ones, and drops all bytes both
ways without closing anything or sending a reset: what a peer behind a dead
network path or a frozen server looks like to its clients.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class BlackholeProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", listen_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.create_server((listen_host, 0))
        self.port = self._listener.getsockname()[1]
        self._dropping = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def blackhole(self) -> None:
        """From now on: accept, hold, and drop everything; never close, never answer."""
        self._dropping.set()

    def connections(self) -> int:
        """How many sockets it holds: clients that connected (and, before `blackhole()`, the
        connections it made to the server for them)."""
        with self._lock:
            return len(self._sockets)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()

    def _keep(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.append(s)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._keep(client)
            if self._dropping.is_set():
                threading.Thread(target=self._pump, args=(client, None), daemon=True).start()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._keep(server)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket | None) -> None:
        while not self._closed.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if dst is None or self._dropping.is_set():
                continue  # swallowed: no answer, no close, no reset
            try:
                dst.sendall(data)
            except OSError:
                return

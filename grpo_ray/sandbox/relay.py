"""The relay of an agent process's endpoint: a loopback port whose every connection is carried to one Unix socket,
the only one sandboxed code reaches (``grpo_ray.sandbox.warden`` runs it outside the sandbox's own process, which may
not open Unix sockets at all)."""

from __future__ import annotations

import selectors
import socket
import threading


def relay(path: str) -> int:
    """Listen on a loopback port and relay each connection to the Unix socket `path`; the port. One thread relays
    them all (a selector), so that a session costs the process no thread of its own."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(256)
    threading.Thread(target=Relay(server, path).run, name="relay", daemon=True).start()
    return server.getsockname()[1]


class Relay:
    """The relay's connections on one selector: bytes read from one end are written to the other, what the other
    cannot take yet kept (and that end not read meanwhile); an end that closes closes its pair once the other end has
    all that was sent to it."""

    def __init__(self, server: socket.socket, path: str):
        self.server, self.path = server, path
        self.sel = selectors.DefaultSelector()
        self.sel.register(server, selectors.EVENT_READ)
        self.peer: dict[socket.socket, socket.socket] = {}
        self.pending: dict[socket.socket, bytes] = {}  # bytes waiting to be written to that end
        self.ended: set[socket.socket] = set()  # ends that closed their side

    def run(self) -> None:
        while True:
            for key, events in self.sel.select():
                s = key.fileobj
                if s is self.server:
                    self.accept()
                    continue
                if s not in self.peer:
                    continue  # closed earlier in this round
                if events & selectors.EVENT_WRITE:
                    self.flush(s)
                if events & selectors.EVENT_READ and s in self.peer:
                    self.read(s)

    def accept(self) -> None:
        conn, _ = self.server.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(self.path)
        except OSError:
            conn.close()
            upstream.close()
            return
        for a, b in ((conn, upstream), (upstream, conn)):
            a.setblocking(False)
            self.peer[a], self.pending[a] = b, b""
            self.sel.register(a, selectors.EVENT_READ)

    def read(self, s: socket.socket) -> None:
        try:
            data = s.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.ended.add(s)
            self.settle(s)
            return
        other = self.peer[s]
        self.pending[other] += data
        self.flush(other)

    def flush(self, s: socket.socket) -> None:
        """Write what is waiting for `s`, as much as it takes now."""
        try:
            sent = s.send(self.pending[s]) if self.pending[s] else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            return self.close(s)
        self.pending[s] = self.pending[s][sent:]
        self.settle(s)
        self.settle(self.peer[s])

    def settle(self, s: socket.socket) -> None:
        """Wait on `s` for what it needs now; close the pair once an end closed and nothing waits for the other."""
        if s not in self.peer:
            return
        other = self.peer[s]
        if (s in self.ended and not self.pending[other]) or (other in self.ended and not self.pending[s]):
            return self.close(s)
        events = (0 if self.pending[other] or s in self.ended else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if self.pending[s] else 0
        )
        if events:
            self.sel.modify(s, events) if s in self.sel.get_map() else self.sel.register(s, events)
        elif s in self.sel.get_map():
            self.sel.unregister(s)

    def close(self, s: socket.socket) -> None:
        for x in (s, self.peer.get(s)):
            if x is not None and x in self.peer:
                if x in self.sel.get_map():
                    self.sel.unregister(x)
                x.close()
                del self.peer[x], self.pending[x]
                self.ended.discard(x)

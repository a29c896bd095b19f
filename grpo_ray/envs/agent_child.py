"""Agent programs in child processes of the generator, under the sandbox (``grpo_ray.rewards.sandbox``), each
program's episode on a thread of its own (programs wait on the model most of the time).

The endpoint (``grpo_ray.endpoint``) listens on a Unix socket of the generator's. In a sandboxed child there is no
network but the child's own loopback, which it brings up, and a port on it relays each connection to that socket:
so a program reaches the endpoint at ``http://127.0.0.1:<port>/s/<session>/v1`` with any OpenAI client, and
nothing else. A program that raises fails its episode with its traceback; one that runs past its time limit, exits
or runs out of memory costs the child, which is replaced (its other episodes are lost with it).
"""

from __future__ import annotations

import contextlib
import inspect
import selectors
import socket
import threading
from concurrent.futures import Future

from grpo_ray.rewards.sandbox import RewardChild, isolate


def loopback_up() -> None:
    """Bring up `lo` in this network namespace (a new one has it down)."""
    import fcntl
    import struct

    get_flags, set_flags, up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, get_flags, struct.pack("16sH14s", b"lo", 0, bytes(14))))[1]
        fcntl.ioctl(s, set_flags, struct.pack("16sH14s", b"lo", flags | up, bytes(14)))


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


def agent_main(conn, memory_mb: int, sandbox: bool, network: bool, sources: dict) -> None:
    isolation = isolate(network) if sandbox else "none (turned off)"
    if isolation == "network+filesystem":
        loopback_up()
    import ctypes
    import resource

    # the address-space cap counts what each thread reserves: its stack (8 MiB) and, glibc's default, a 64 MiB malloc
    # arena of its own, up to 8 a core. benchmarks/verifiers_episode.py at 32 sessions a process (the relay on one
    # thread), the processes' peak address space: 0.79 GB with two arenas in all, 1.71 GB of the 2 GiB cap without
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    port, lock = relay(sources["endpoint"]), threading.Lock()
    try:  # the program's module now, not in its first episode's time limit
        from grpo_ray.envs.agent import program

        program(sources["program"])
    except BaseException:
        pass  # each episode says why
    conn.send(isolation)

    def episode(key: str, name: str, kwargs: dict, row: dict) -> None:
        try:
            from grpo_ray.envs.agent import program, reward_of

            out = program(name)(f"http://127.0.0.1:{port}/s/{key}/v1", row, **kwargs)
            if inspect.isawaitable(out):
                import asyncio

                out = asyncio.run(out)
            answer = ("ok", reward_of(out))
        except MemoryError:
            answer = ("memory", None)
        except BaseException as e:  # SystemExit too: the program's episode fails, not the child
            from grpo_ray import envs
            from grpo_ray.rewards.runner import failure_text

            answer = ("error", failure_text(e, (__file__, envs.__file__)))
        with lock:
            conn.send((key, *answer))

    while True:
        try:
            call = conn.recv()
        except EOFError:
            return
        threading.Thread(target=episode, args=call, daemon=True).start()


class AgentChild(RewardChild):
    """One child process running agent programs' episodes at once; ``start`` gives each one's future."""

    main = staticmethod(agent_main)
    grace_s = 5.0

    def __init__(self, memory_mb: int, sandbox: bool, endpoint: str, program: str, network: bool = False):
        self.pending: dict[str, tuple[Future, object]] = {}
        """Each running episode's future, with the pipe it was sent on (a replaced child's end with it)."""
        self.lock = threading.Lock()
        super().__init__(memory_mb, sandbox, network=network, sources={"endpoint": endpoint, "program": program})
        self._listen()

    def _listen(self) -> None:
        threading.Thread(target=self._read, args=(self.conn,), daemon=True).start()

    def _read(self, conn) -> None:
        """Answer each episode's future as its result comes; when this pipe ends (the child died or was
        replaced), every episode still pending on it ("died")."""
        while True:
            try:
                key, outcome, value = conn.recv()
            except (EOFError, OSError):
                break
            with self.lock:
                done, _ = self.pending.pop(key, (None, None))
            if done is not None:
                done.set_result((outcome, value))
        with self.lock:
            lost = [k for k, (_, c) in self.pending.items() if c is conn]
            futures = [self.pending.pop(k)[0] for k in lost]
        for f in futures:
            f.set_result(("died", None))

    def start(self, key: str, program: str, kwargs: dict, row: dict, timeout_s: float) -> Future:
        """Run the program's episode `key` on `row`; its future gives ("ok", reward) | ("error", traceback) |
        ("timeout" | "died" | "memory", None). Past `timeout_s` the child is replaced, and the episodes it ran end
        ("died")."""
        done: Future = Future()
        with self.lock:
            try:
                self.conn.send((key, program, kwargs, row))
                self.pending[key] = (done, self.conn)
            except (OSError, EOFError):
                done.set_result(("died", None))
                return done
        timer = threading.Timer(timeout_s, self._overdue, args=(key, done))
        timer.daemon = True
        timer.start()
        done.add_done_callback(lambda _: timer.cancel())
        return done

    def _overdue(self, key: str, done: Future) -> None:
        with self.lock:
            if self.pending.get(key, (None,))[0] is not done:
                return
            self.pending.pop(key)
        done.set_result(("timeout", None))
        self.restart()

    def restart(self) -> None:
        with self.lock:
            super().restart()
        self._listen()

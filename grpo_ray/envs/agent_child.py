"""Agent programs in child processes of the generator, under the sandbox (``grpo_ray.sandbox``), each program's
episode on a thread of its own (programs wait on the model most of the time).

The endpoint (``grpo_ray.rollouts.endpoint``) listens on a Unix socket of the generator's. In a sandboxed child there is
no network but the child's own loopback, and no Unix socket at all: the sandbox's warden listens on a port of that
loopback and relays each connection to the endpoint's socket (``grpo_ray.sandbox.relay``), so a program reaches the
endpoint at ``http://127.0.0.1:<port>/s/<session>/v1`` with any OpenAI client, and nothing else. A program that raises
fails its episode with its traceback; one that runs past its time limit, exits or runs out of memory costs the child,
which is replaced (its other episodes are lost with it).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from concurrent.futures import Future

from grpo_ray.sandbox import Child, Jail


def agent_main(conn, isolation: str, spec: dict) -> None:
    import ctypes

    # the address-space cap counts what each thread reserves: its stack (8 MiB) and, glibc's default, a 64 MiB malloc
    # arena of its own, up to 8 a core. benchmarks/verifiers_episode.py at 32 sessions a process (the relay on one
    # thread), the processes' peak address space: 0.79 GB with two arenas in all, 1.71 GB of the 2 GiB cap without
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX
    sources, port, lock = spec["sources"], spec["port"], threading.Lock()
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
            from grpo_ray.sandbox import failure_text

            answer = ("error", failure_text(e, (__file__, envs.__file__)))
        with lock:
            conn.send((key, *answer))

    while True:
        try:
            call = conn.recv()
        except EOFError:
            return
        threading.Thread(target=episode, args=call, daemon=True).start()


class AgentChild(Child):
    """One child process running agent programs' episodes at once; ``start`` gives each one's future."""

    main = "grpo_ray.envs.agent_child:agent_main"
    grace_s = 5.0

    def __init__(self, jail: Jail, endpoint: str, program: str):
        """`endpoint`: the Unix socket the programs reach (through a loopback port of the child's own)."""
        self.pending: dict[str, tuple[Future, object]] = {}
        """Each running episode's future, with the pipe it was sent on (a replaced child's end with it)."""
        self.lock = threading.Lock()
        super().__init__(jail, sources={"program": program}, relay=endpoint)
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

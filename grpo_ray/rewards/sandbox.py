"""Reward functions run in a child process of the reward actor, under limits.

``RewardChild`` keeps one child process and hands it samples over a pipe, one (``run``) or a batch at once
(``run_many``: the child answers each as it is scored, so a sample costs no round trip of its own):

- time: the parent waits ``timeout_s`` for each answer; past it the child is killed and a new one started;
- exit: a child that dies (``os._exit``, a crash, the kernel's OOM killer) is seen at once (the pipe
  closes) and replaced;
- memory: the child's address space is capped (``RLIMIT_AS``), so a huge allocation raises MemoryError
  inside the reward function; the sample scores 0 and the child is replaced;
- isolation, where the OS allows it (Linux with unprivileged user namespaces): the child enters new
  user, network and mount namespaces, so it has no network (not even loopback to this node; unless
  ``reward.network`` allows it: then it keeps the node's) and every
  filesystem is read-only except a private tmpfs scratch directory, its working directory, HOME and
  TMPDIR. ``/proc``, ``/sys`` and ``/dev`` (including ``/dev/shm``) stay as they were. Where namespaces
  are not available the child runs with the time and memory limits only, and says so (``isolation``).
"""

from __future__ import annotations

import multiprocessing as mp
import os

MEMORY_ERROR = "memory"


def isolate(network: bool = False) -> str:
    """Enter new user + network + mount namespaces (no network namespace when `network`) with a read-only
    filesystem and a tmpfs scratch dir.

    Returns "network+filesystem" (or "filesystem") when done, else "none (<reason>)". Must run before any thread
    starts."""
    import ctypes
    import tempfile

    libc = ctypes.CDLL(None, use_errno=True)
    newuser, newnet, newns = 0x10000000, 0x40000000, 0x00020000
    rdonly, remount, bind, rec, private = 1, 32, 4096, 16384, 1 << 18
    scratch = tempfile.mkdtemp(prefix="grpo-reward-")
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(newuser | newns | (0 if network else newnet)) != 0:
        return f"none (unshare: {os.strerror(ctypes.get_errno())})"
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError as e:
        return f"none (id maps: {e.strerror})"
    libc.mount(None, b"/", None, rec | private, None)
    with open("/proc/self/mountinfo") as f:
        points = sorted({line.split()[4] for line in f}, key=len)
    for point in points:
        if point.startswith(("/proc", "/sys", "/dev")):
            continue
        p = point.encode()
        if point != "/":  # a copy over the root would leave this process's root beneath it: "chrooted", to which
            libc.mount(p, p, None, bind | rec, None)  # the kernel refuses user namespaces (Harbor tasks make theirs)
        libc.mount(None, p, None, remount | bind | rdonly, None)  # a mount that refuses stays as it was
    if libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", 0, None) != 0:
        return f"none (scratch tmpfs: {os.strerror(ctypes.get_errno())})"
    os.chdir(scratch)
    os.environ.update(HOME=scratch, TMPDIR=scratch)
    tempfile.tempdir = scratch  # (tempfile had chosen /tmp above, and keeps its first choice)
    return "filesystem" if network else "network+filesystem"


def child_main(conn, memory_mb: int, sandbox: bool, network: bool, sources: dict[str, str]) -> None:
    isolation = isolate(network) if sandbox else "none (turned off)"
    import resource

    from grpo_ray.rewards import runner
    from grpo_ray.rewards.runner import score_one

    runner.SOURCES.update(sources)
    runner.NETWORK["allowed"] = not isolation.startswith("network+")

    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    conn.send(isolation)
    while True:
        try:
            tasks = conn.recv()
        except EOFError:
            return
        for one in tasks:  # a batch (run_many) is answered sample by sample
            try:
                conn.send(score_one(*one))
            except MemoryError:  # past the limit outside the reward function's own try (e.g. sending a huge result)
                conn.send(MEMORY_ERROR)


class RewardChild:
    """One child process scoring samples under a time limit, a memory limit and (where possible) a sandbox."""

    main = staticmethod(child_main)
    """What the child runs: (its end of the pipe, memory_mb, sandbox, network, sources)."""
    grace_s = 0.0
    """How long ``close`` lets the child end on its own (a reward child holds nothing: none)."""

    def __init__(
        self, memory_mb: int, sandbox: bool = True, network: bool = False, sources: dict | None = None, wait=True
    ):
        """`wait=False`: return once the child is spawned; its start (an interpreter and its imports) goes on
        while the caller works, and the first task waits for it."""
        self.memory_mb, self.sandbox, self.network, self.sources = memory_mb, sandbox, network, sources or {}
        self._spawn()
        if wait:
            self._ready()

    def _spawn(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        args = (theirs, self.memory_mb, self.sandbox, self.network, self.sources)
        self.proc = ctx.Process(target=self.main, args=args, daemon=True)
        self.proc.start()
        theirs.close()
        self.isolation: str | None = None  # what the child says once it has started

    def _ready(self) -> None:
        if self.isolation is None:
            if not self.conn.poll(60):
                raise RuntimeError(f"{type(self).__name__} did not start within 60 s")
            self.isolation = self.conn.recv()

    def restart(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()
        self._spawn()
        self._ready()

    def run(self, task: tuple, timeout_s: float) -> tuple[str, object]:
        """("ok", result) | ("timeout", None) | ("died", None) | ("memory", None); the child is replaced after
        anything but "ok"."""
        return self.run_many([task], timeout_s)[0]

    def run_many(self, tasks: list[tuple], timeout_s: float) -> list[tuple[str, object]]:
        """``run`` of each of `tasks`, sent at once: each answer is waited for `timeout_s`; after anything but "ok"
        the child is replaced and the tasks after that one are sent again."""
        self._ready()
        out: list[tuple[str, object]] = []
        while len(out) < len(tasks):
            try:
                self.conn.send(tasks[len(out) :])
                while len(out) < len(tasks):
                    if not self.conn.poll(timeout_s):
                        out.append(("timeout", None))
                        break
                    result = self.conn.recv()
                    if result == MEMORY_ERROR or result[2]:
                        out.append(("memory", None))
                        break
                    out.append(("ok", result))
            except (EOFError, BrokenPipeError, ConnectionResetError):
                out.append(("died", None))
            if out[-1][0] != "ok":
                self.restart()
        return out

    def close(self) -> None:
        """End the process: once its pipe closes it has `grace_s` to end on its own (to free what it holds), then it
        is killed."""
        self.conn.close()
        if self.grace_s:
            self.proc.join(self.grace_s)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()

"""Untrusted code (reward functions, environments, agent programs, the commands of a Harbor task) in a child process
that reaches nothing it was not handed.

``Child`` keeps one such process and hands it work over a pipe. Its process is started with a short allow-list of
environment variables (ALLOWED, and the names a recipe passes on), never the node's tokens or keys, and isolated by
``grpo_ray.sandbox.warden`` as bubblewrap would isolate it: namespaces of its own, a root of read-only folders with a
capped tmpfs scratch, no Unix socket by address, its own processes only, limits on memory and processes. What held
and what the kernel refused is its ``isolation``: ``network+filesystem+processes+sockets`` when every layer holds
(without ``network`` when the network is kept), else ``... (missing: what, why)``; ``none (turned off)`` without
the sandbox. Time and memory limits hold either way:

- time: the parent waits ``timeout_s`` for each answer; past it the process is stopped and a new one started;
- exit: a process that dies (``os._exit``, a crash, the kernel's OOM killer) is seen at once (the pipe closes);
- memory: the address space is capped, so a huge allocation raises MemoryError in the code that made it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

ALLOWED = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "PYTHONHASHSEED",
    "PYTHONUNBUFFERED",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)
"""The environment variables a sandboxed process sees (and ``LC_*``), beside HOME and TMPDIR (its scratch) and those
a recipe passes on by name (``reward.pass_env``, ``environment.pass_env``)."""
MEMORY_ERROR = "memory"
"""What a sandboxed process sends for a call that ran out of its address space outside the code's own handling."""
FULL = "network+filesystem+processes+sockets"
"""The isolation of a sandbox in which every layer held, without network."""


@dataclass
class Jail:
    """What a sandboxed child may use: its limits and what it is handed."""

    memory_mb: int = 2048
    """Address-space cap."""
    sandbox: bool = True
    """False: no isolation (the time and memory limits still hold)."""
    network: bool = False
    """Keep the node's network (the filesystem stays read-only, Unix sockets stay refused)."""
    max_processes: int = 64
    """Processes and threads at once."""
    scratch_mb: int = 256
    """Size of the scratch tmpfs (/tmp, HOME) and, as much again, of /dev/shm."""
    paths: list[str] = field(default_factory=list)
    """The node's paths shown read-only beside the system's, Python's and sys.path's."""
    pass_env: list[str] = field(default_factory=list)
    """Environment variables passed on by name (an API key a reward calls with)."""
    namespaces: bool = True
    """False: isolate without user namespaces, as on a node that refuses them (tests the fallback)."""

    @classmethod
    def of(cls, section) -> Jail:
        """The jail a recipe's ``reward`` or ``environment`` section asks for."""
        keys = ("memory_mb", "sandbox", "network", "max_processes", "scratch_mb", "paths", "pass_env")
        return cls(**{k: getattr(section, k) for k in keys})


def environment(jail: Jail) -> dict[str, str]:
    """The environment a sandboxed process starts with: ALLOWED, ``LC_*`` and the jail's ``pass_env`` of this one's
    (all of it without the sandbox)."""
    if not jail.sandbox:
        return dict(os.environ)
    return {k: v for k, v in os.environ.items() if k in ALLOWED or k.startswith("LC_") or k in jail.pass_env}


class Child:
    """One sandboxed process running `main` (``module:function``, called as ``main(conn, isolation, spec)``: it
    sends `isolation` once it is ready, then answers what it is sent)."""

    main = ""
    """What the process runs (each kind of child names its own)."""
    grace_s = 0.0
    """How long ``close`` lets the process end on its own (to free what it holds)."""

    def __init__(self, jail: Jail, sources: dict | None = None, wait: bool = True, relay: str | None = None):
        """`sources`: what `main` is handed (its spec's ``sources``); `relay`: a Unix socket the process reaches at a
        loopback port of its own (``spec["port"]``); `wait=False`: return once the process is spawned, its start
        going on while the caller works (the first task waits for it)."""
        self.jail, self.sources, self.relay = jail, sources or {}, relay
        self._spawn()
        if wait:
            self._ready()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        path = [os.path.abspath(p) for p in sys.path]
        boot = f"import sys; sys.path[:0] = {json.dumps(path)}; from grpo_ray.sandbox.warden import main; "
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", f"{boot}main({theirs.fileno()})"],
            env=environment(self.jail),
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        spec = {
            **vars(self.jail),
            "main": self.main,
            "sources": self.sources,
            "relay": self.relay,
            "sys_path": path,
            "home": os.path.expanduser("~"),
        }
        self.conn.send(spec)
        self.isolation: str | None = None  # what the process says once it has started

    def _ready(self) -> None:
        if self.isolation is None:
            if not self.conn.poll(60):
                raise RuntimeError(f"{type(self).__name__} did not start within 60 s")
            hello = self.conn.recv()
            if isinstance(hello, tuple):  # ("failed", why): the sandbox could not be made
                raise RuntimeError(f"{type(self).__name__}: {hello[1]}")
            self.isolation = hello

    def restart(self) -> None:
        self._stop()
        self._spawn()
        self._ready()

    def _hang_up(self) -> None:
        """Close the pipe so that the process reads its end at once: shut down first (a thread of ours blocked reading
        the pipe would otherwise keep it open, and the process would not see the end)."""
        if not self.conn.closed:
            with contextlib.suppress(OSError):
                socket.socket(fileno=os.dup(self.conn.fileno())).shutdown(socket.SHUT_RDWR)
            self.conn.close()

    def _stop(self) -> None:
        """End the process now (its warden removes what it made, then ends)."""
        self._hang_up()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        """End the process: once its pipe closes it has `grace_s` to end on its own (to free what it holds), then it
        is stopped."""
        self._hang_up()
        if self.grace_s:
            try:
                self.proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                pass
        self._stop()


LAYERS = ("network", "filesystem", "processes", "sockets")


def held(isolation: str) -> set[str]:
    """The layers that held, of an isolation's text."""
    return set(isolation.split(" ")[0].split("+")) & set(LAYERS)


def complete(isolation: str, network: bool = False) -> bool:
    """Whether every layer of the sandbox held (`network`: the network was kept, so its layer is not counted)."""
    return isolation == (FULL.removeprefix("network+") if network else FULL)


def failure_text(e: BaseException, ours: tuple[str, ...] = ()) -> str:
    """The traceback of `e` raised by user code in a child, from that code down: the frames of the files `ours`
    (the child's own, grpo-ray's) left out."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename not in ours]
    head = ["Traceback (most recent call last):\n", *traceback.format_list(frames)] if frames else []
    return "".join([*head, *traceback.format_exception_only(type(e), e)])

"""The sandbox's processes. The warden (this module's ``main``, started by ``grpo_ray.sandbox.Child`` with an
environment of a few allowed variables) stays in the node's namespaces: it relays the agent endpoint if there is
one, and forks the keeper, which enters new user, PID, IPC, UTS and mount namespaces (and a network namespace unless
the network is kept); the warden maps the keeper's user. The keeper forks the jailed process (PID 1 of its
namespace), which builds its root, becomes the jail's user and runs the child's code; each waits for the one it
started and ends with it. The jail's user is the warden's own where it is not root; where it is root, the node's
unprivileged ``nobody``, so that the kernel's process cap holds (it exempts root), keeping of root's powers only the
reading of files (of the folders the jail shows).

The jailed process, as bubblewrap lays one out (``--unshare-all --tmpfs /tmp --dev /dev --proc /proc --ro-bind``):

- a root of its own: the node's system folders (``/usr``, ``/etc``, ``/lib`` ...), the Python installation, every
  folder on ``sys.path`` and the paths it is handed, each bound read-only; a fresh tmpfs ``/tmp`` (its scratch:
  HOME, TMPDIR and the working directory) and ``/dev/shm``, each capped in size; a ``/dev`` of null, zero, full,
  random, urandom and tty; a fresh ``/proc`` of its own PID namespace. Nothing else of the node is there: not its
  ``/tmp`` (Ray's sockets and object store), ``/run``, ``/var``, home folders or other processes;
- no capability that could remount, unmount or map it out (those of its namespace given up, the bounding set too);
- a seccomp filter: sockets only of the internet and netlink families (no Unix socket by address, pathname or
  abstract, no vsock; ``socketpair`` stays), no ptrace, io_uring, bpf, keyrings or kernel log;
- a Landlock domain where the kernel has one (signals and abstract sockets kept inside the jail);
- limits on address space (``memory_mb``), processes and threads (``max_processes``), core files.

Where user namespaces are refused (a container without them), the jailed process keeps the node's namespaces and is
held by Landlock instead: reads of the same paths only, writes of a scratch folder only, TCP to the relay's port only
(no network), and by the seccomp filter; what that cannot hold (a process cap, a scratch size cap) is said in its
isolation, as is every step the kernel refused.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import threading
import traceback
from multiprocessing.connection import Connection

from grpo_ray.sandbox import LAYERS, kernel
from grpo_ray.sandbox.kernel import Refused
from grpo_ray.sandbox.relay import Relay

SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
"""The node's top-level folders every jail shows (read-only); links among them are kept as links."""
NEVER = ("/tmp", "/var/tmp", "/home", "/root", "/var", "/srv", "/mnt", "/media", "/opt")
"""Folders no jail shows, nor any folder that holds one (nor the user's home): sockets, other users' and the
node's secrets. A path beneath one may be shown (a checkout under /tmp, Python under /root/.pyenv)."""
NOTHING_BENEATH = ("/run", "/var/run", "/dev", "/proc", "/sys")
"""Folders of which no jail shows anything."""
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
FAMILIES = (kernel.AF_INET, kernel.AF_INET6, kernel.AF_NETLINK)
NOBODY = 65534
JAILED = 1000
"""Where the warden is root: the jail's user id in its namespace, mapped to the node's nobody (the kernel exempts
root from the process cap, and a user namespace made in the jail, a Harbor task's, maps root only with a capability
the jail does not keep)."""


def main(fd: int) -> None:
    """The warden: read the child's spec from the pipe `fd`, fork the keeper, map its user, relay, wait."""
    conn = Connection(fd)
    spec = conn.recv()
    if not spec["sandbox"]:
        limits(spec, cap=False)
        run(conn, spec, "none (turned off)")
    spec["shown"] = paths(spec)
    ours, theirs = socket.socketpair()
    server = listen() if spec.get("relay") and spec["network"] else None
    spec["port"] = server and server.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        ours.close()
        keeper(conn, spec, theirs, server)
    theirs.close()
    conn.close()
    signal.signal(signal.SIGTERM, lambda *_: stop(pid))
    scratch, server = settle(ours, pid, spec, server)
    if server is not None:
        threading.Thread(target=Relay(server, spec["relay"]).run, name="relay", daemon=True).start()
    code = wait(pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what is left is the cleaning up: a stop now waits for it
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    os._exit(code)


def stop(pid: int) -> None:
    """The warden told to stop (SIGTERM): the keeper (and with it the jail) is killed; the warden's wait ends."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def settle(sync: socket.socket, pid: int, spec: dict, server):
    """The warden's side of the keeper's start: map its user once it has its namespaces, and take the relay's socket
    it makes in its network; or, where it could not have them, make its scratch folder and the relay's socket on the
    node. The scratch folder (if one was made) and the socket to relay from (if any)."""
    said, scratch = json.loads(sync.recv(4096)), None
    if said["unshared"]:
        uid, gid = os.geteuid(), os.getegid()
        try:  # root keeps root (to build the jail) and lends JAILED nobody's id (the jail's processes' own)
            if uid == 0:
                kernel.map_ids([(0, 0), (JAILED, NOBODY)], [(0, 0), (JAILED, NOBODY)], pid)
            else:
                kernel.map_ids([(uid, uid)], [(gid, gid)], pid)
            answer = {"mapped": True}
        except Refused as e:
            answer = {"mapped": False, "why": str(e)}
    else:
        scratch = tempfile.mkdtemp(prefix="grpo-sandbox-")
        server = server or (listen() if spec.get("relay") else None)
        answer = {"scratch": scratch, "port": server and server.getsockname()[1]}
    sync.sendall(json.dumps(answer).encode())
    if spec.get("relay") and not spec["network"] and answer.get("mapped"):
        _, fds, _, _ = socket.recv_fds(sync, 16, 1)
        server = socket.socket(fileno=fds[0]) if fds else None
    sync.close()
    return scratch, server


def keeper(conn, spec: dict, sync: socket.socket, server) -> None:
    """The keeper: enter the namespaces, be mapped, start the relay's socket in its network and fork the jailed
    process; then wait for it. In the fallback (no user namespaces) it is the jailed process itself."""
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL, "parent death signal")
    missing: list[str] = []
    try:
        if not spec.get("namespaces", True):
            raise Refused("user namespaces (turned off for this child)", 95)
        flags = kernel.NEWUSER | kernel.NEWPID | kernel.NEWIPC | kernel.NEWUTS
        kernel.unshare(flags | (0 if spec["network"] else kernel.NEWNET), "unshare (user namespaces)")
        sync.sendall(json.dumps({"unshared": True}).encode())
    except Refused as e:
        sync.sendall(json.dumps({"unshared": False}).encode())
        missing.append(f"namespaces ({e.strerror})")
    answer = json.loads(sync.recv(4096))
    if "scratch" in answer:  # the fallback: this process is the jail
        sync.close()
        if server is not None:
            server.close()
        jailed(conn, spec, missing, answer["scratch"], answer["port"])
    if not answer["mapped"]:
        conn.send(("failed", f"none (the sandbox failed: {answer['why']})"))
        os._exit(1)
    kernel.unshare(kernel.NEWNS, "unshare (mount namespace)")
    if spec.get("relay") and not spec["network"]:
        kernel.loopback_up()
        server = listen()
        spec["port"] = server.getsockname()[1]
        socket.send_fds(sync, [b"relay"], [server.fileno()])
    sync.close()
    if server is not None:
        server.close()
    pid = os.fork()
    if pid == 0:
        jailed(conn, spec, missing, None, spec["port"])
    conn.close()
    os._exit(wait(pid))


def wait(pid: int) -> int:
    """Wait for `pid`; its exit code (128 + the signal that killed it)."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def listen() -> socket.socket:
    """The relay's listening socket, on this network namespace's loopback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(256)
    return server


def jailed(conn, spec: dict, missing: list[str], scratch: str | None, port: int | None):
    """The jailed process: isolated as the namespaces allow, then the child's code. Never returns."""
    try:
        kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL, "parent death signal")
        if scratch is None:
            held = ["network"] if not spec["network"] else []
            missing += build_root(spec)
            held += ["filesystem", "processes"]
            limits(spec, cap=True)
            become_jailed()
            home = "/tmp"
        else:
            held, home = [], scratch
            limits(spec, cap=False)
            missing += ["a process cap (no user namespace)", "a scratch size cap (files are capped one by one)"]
            missing += fallback(spec, scratch, port, held)
            kernel.drop_capabilities()
        kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
        missing += scopes()
        try:  # without a network namespace and without network: TCP alone (Landlock holds it to the relay's port)
            bare = scratch is not None and not spec["network"]
            kernel.seccomp(FAMILIES[:2] if bare else FAMILIES, stream_only=bare)
            held.append("sockets")
        except Refused as e:
            missing.append(f"sockets ({e})")
        os.environ.update(HOME=home, TMPDIR=home, PWD=home)
        os.chdir(home)
        tempfile.tempdir = home
        spec["port"] = port
        text = "+".join(x for x in LAYERS if x in held) + (f" (missing: {'; '.join(missing)})" if missing else "")
    except BaseException as e:  # a step that failed in a way the report cannot hold: the child says so and ends
        conn.send(("failed", f"none (the sandbox failed: {e})"))
        os._exit(1)
    run(conn, spec, text)


def run(conn, spec: dict, isolation: str) -> None:
    """Run the child's code (``spec["main"]``, ``module:function``) as ``main(conn, isolation, spec)``; end the
    process with it."""
    code = 0
    try:
        module, _, name = spec["main"].partition(":")
        getattr(importlib.import_module(module), name)(conn, isolation, spec)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent has gone (a run that stopped before start, a replaced child): nothing to say
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


def limits(spec: dict, cap: bool) -> None:
    """The address-space cap, no core files; `cap`: the process cap (counted per user namespace: the jail's own
    processes and threads), else (where the sandbox holds) each file's size at the scratch's."""
    memory = spec["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cap:
        resource.setrlimit(resource.RLIMIT_NPROC, (spec["max_processes"], spec["max_processes"]))
    elif spec["sandbox"]:
        scratch = spec["scratch_mb"] << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (scratch, scratch))


def paths(spec: dict) -> list[str]:
    """The node's folders (and files) the jail shows, read-only: the system's, Python's, ``sys.path``'s, the
    package's own and those handed (``spec["paths"]``), each once (not beneath another); none of NEVER nor one
    holding one, nothing beneath NOTHING_BENEATH."""
    wanted = [f"/{name}" for name in SYSTEM if os.path.isdir(f"/{name}") and not os.path.islink(f"/{name}")]
    wanted += [sys.prefix, sys.base_prefix, sys.exec_prefix, *spec["sys_path"], *spec.get("paths", [])]
    wanted.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # grpo_ray itself: an editable
    # install finds it by a hook, not by a folder on sys.path (run from another folder than the checkout)
    if spec["network"]:  # the resolver's configuration may be a link into /run
        wanted.append(os.path.realpath("/etc/resolv.conf"))
    never = (*NEVER, *NOTHING_BENEATH, os.path.realpath(spec.get("home") or "/root"))
    out: list[str] = []
    for path in sorted({os.path.realpath(p) for p in wanted if p and os.path.exists(p)}, key=len):
        if path == "/" or any(path == n or n.startswith(path + "/") for n in never):
            continue
        if any(path.startswith(n + "/") for n in NOTHING_BENEATH) and path != os.path.realpath("/etc/resolv.conf"):
            continue
        if not any(path == o or path.startswith(o + "/") for o in out):
            out.append(path)
    return out


def become_jailed() -> None:
    """Become the jail's user and give up the namespace's capabilities (nothing it runs can remount, unmount or map
    its way out): as root's keeper, JAILED (the node's nobody) keeping only the reading of files of root's (a
    folder made by mkdtemp is root's alone); else the keeper's own user, keeping none."""
    if os.getuid() != 0:
        return kernel.drop_capabilities()
    kernel.drop_bounding(keep=kernel.CAP_DAC_READ_SEARCH)
    kernel.prctl(kernel.PR_SET_KEEPCAPS, 1, "keep capabilities")
    os.setresgid(JAILED, JAILED, JAILED)
    os.setresuid(JAILED, JAILED, JAILED)
    kernel.set_capabilities(keep=kernel.CAP_DAC_READ_SEARCH)
    kernel.prctl(kernel.PR_SET_DUMPABLE, 1, "dumpable")  # (a change of user clears it: /proc/self would be root's)
    # a change of user clears the parent-death signal too: without it again, the user's code outlives its keeper
    # (a hung step kept running, asleep, after its child was replaced or its run ended)
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL, "parent death signal")


def build_root(spec: dict) -> list[str]:
    """Make this process's root the jail's (in the keeper's mount namespace); what could not be made read-only,
    as missing."""
    kernel.mount(None, "/", None, kernel.REC | kernel.PRIVATE)
    kernel.mount("tmpfs", "/tmp", "tmpfs", kernel.NOSUID | kernel.NODEV, "size=64k,mode=0755")
    os.mkdir("/tmp/new")
    os.mkdir("/tmp/old")
    kernel.pivot_root("/tmp", "/tmp/old")  # the node's root is /old from here, the jail's is built at /new
    os.chdir("/")
    kernel.mount("tmpfs", "/new", "tmpfs", kernel.NOSUID | kernel.NODEV, "size=1m,mode=0755")
    for name in os.listdir("/old"):
        if name in SYSTEM and os.path.islink(f"/old/{name}"):
            os.symlink(os.readlink(f"/old/{name}"), f"/new/{name}")
    size = f"size={spec['scratch_mb']}m"
    os.mkdir("/new/tmp")  # first: a folder shown beneath /tmp (a checkout there) is bound into the scratch
    kernel.mount("tmpfs", "/new/tmp", "tmpfs", kernel.NOSUID | kernel.NODEV, f"{size},mode=1777")
    for path in spec["shown"]:
        bind(f"/old{path}", f"/new{path}", os.path.isdir(f"/old{path}"))
    os.makedirs("/new/dev", exist_ok=True)
    kernel.mount("tmpfs", "/new/dev", "tmpfs", kernel.NOSUID | kernel.NODEV, "size=64k,mode=0755")
    for name in DEVICES:
        if os.path.exists(f"/old/dev/{name}"):
            bind(f"/old/dev/{name}", f"/new/dev/{name}", False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "fd/0"), ("stdout", "fd/1"), ("stderr", "fd/2")):
        os.symlink(target, f"/new/dev/{name}")
    os.mkdir("/new/dev/shm")
    kernel.mount("tmpfs", "/new/dev/shm", "tmpfs", kernel.NOSUID | kernel.NODEV, f"{size},mode=1777")
    os.mkdir("/new/proc")
    kernel.mount("proc", "/new/proc", "proc", kernel.NOSUID | kernel.NODEV | kernel.NOEXEC)
    missing = read_only("/new", keep=("/new/tmp", "/new/dev/shm", "/new/proc"))
    kernel.umount("/old")
    os.chdir("/new")
    kernel.pivot_root(".", ".")
    kernel.umount(".")
    os.chdir("/")
    return missing


def bind(source: str, target: str, folder: bool) -> None:
    """Bind `source` (and what is mounted beneath it) at `target`, making the folders on the way."""
    os.makedirs(target if folder else os.path.dirname(target), exist_ok=True)
    if not folder:
        open(target, "a").close()
    kernel.mount(source, target, None, kernel.BIND | kernel.REC)


ATIME = {"noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21, "strictatime": 1 << 24}
LOCKED = {"nosuid": kernel.NOSUID, "nodev": kernel.NODEV, "noexec": kernel.NOEXEC, **ATIME}


def read_only(root: str, keep: tuple[str, ...]) -> list[str]:
    """Remount every mount at or beneath `root` read-only (but those at `keep`), each with the flags it had (a
    mount brought from the node keeps them locked); then read the mount table again: what is still writable."""

    def mounts() -> list[tuple[str, str]]:
        with open("/old/proc/self/mountinfo") as f:
            rows = [line.split() for line in f]
        return [(r[4], r[5]) for r in rows if (r[4] == root or r[4].startswith(root + "/")) and r[4] not in keep]

    for point, options in mounts():
        flags = sum(LOCKED.get(o, 0) for o in options.split(","))
        try:
            kernel.mount(None, point, None, kernel.REMOUNT | kernel.BIND | kernel.RDONLY | flags)
        except Refused:
            pass  # read again below, as the mount table has it
    return [f"{point.removeprefix(root)} stays writable" for point, options in mounts() if "rw" in options.split(",")]


def fallback(spec: dict, scratch: str, port: int | None, held: list[str]) -> list[str]:
    """Without namespaces: Landlock holds reads to the shown paths and the scratch, writes to the scratch, TCP to
    the relay's `port` (without network). What the kernel's Landlock cannot hold, as missing."""
    devices = [f"/dev/{name}" for name in DEVICES if os.path.exists(f"/dev/{name}")]
    kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
    try:
        missing = kernel.landlock(
            read=[*spec["shown"], scratch, *devices],
            write=[scratch, *devices],
            tcp_ports=None if spec["network"] else [port] if port else [],
        )
    except Refused as e:
        return [f"filesystem, network ({e})"]
    held += ["filesystem"] + ([] if spec["network"] or any(m.startswith("TCP") for m in missing) else ["network"])
    return missing


def scopes() -> list[str]:
    """Signals and abstract sockets kept inside the jail (Landlock ABI 6), where the kernel can."""
    try:
        return kernel.landlock(read=None, write=None, tcp_ports=None)
    except Refused as e:
        return [f"signals and abstract sockets ({e})"]

"""The kernel's isolation calls, through libc (Python 3.11 has no ``os.unshare``): namespaces, mounts, a seccomp filter
and a Landlock domain. Each raises ``Refused`` naming the step and the kernel's reason, so that the sandbox can say
exactly what is missing. Linux only; x86_64 and aarch64 for the seccomp filter."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

NEWUSER, NEWNS, NEWPID, NEWNET, NEWIPC, NEWUTS = 0x10000000, 0x20000, 0x20000000, 0x40000000, 0x8000000, 0x4000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
DETACH = 2
PR_SET_DUMPABLE, PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 1, 38, 22, 2

_libc = ctypes.CDLL(None, use_errno=True)


class Refused(OSError):
    """A step the kernel refused: ``what`` it was and ``why`` (strerror)."""

    def __init__(self, what: str, err: int):
        super().__init__(err, f"{what}: {os.strerror(err)}")
        self.what = what


def call(rc: int, what: str) -> int:
    if rc < 0:
        raise Refused(what, ctypes.get_errno())
    return rc


def unshare(flags: int, what: str) -> None:
    call(_libc.unshare(flags), what)


def map_ids(uids: list[tuple[int, int]], gids: list[tuple[int, int]], pid: int | str = "self") -> None:
    """Map each (inside, outside) user id pair of `uids` in process `pid`'s new user namespace (and the group ids
    so); a process maps only its own ids unless it has CAP_SETUID where the namespace was made."""
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", lines(uids)), ("gid_map", lines(gids))):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
    except OSError as e:
        raise Refused(f"user namespace id maps ({name})", e.errno or errno.EPERM) from None


def lines(pairs: list[tuple[int, int]]) -> str:
    return "".join(f"{inside} {outside} 1\n" for inside, outside in pairs)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    call(_libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {fstype or source or ''} at {target}")


def umount(target: str) -> None:
    call(_libc.umount2(target.encode(), DETACH), f"umount {target}")


def pivot_root(new: str, old: str) -> None:
    call(_libc.syscall(SYSCALLS["pivot_root"], new.encode(), old.encode()), "pivot_root")


def prctl(option: int, arg: int, what: str) -> None:
    call(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), what)


def loopback_up() -> None:
    """Bring up `lo` in this network namespace (a new one has it down)."""
    import fcntl
    import socket

    get_flags, set_flags, up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, get_flags, struct.pack("16sH14s", b"lo", 0, bytes(14))))[1]
        fcntl.ioctl(s, set_flags, struct.pack("16sH14s", b"lo", flags | up, bytes(14)))


# --- seccomp: a filter of syscalls and socket families -------------------------------------------------------------

ARCH = platform.machine()
SYSCALLS = {  # the numbers the filter and pivot_root use, per architecture
    "x86_64": {
        "pivot_root": 155,
        "socket": 41,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 321,
        "perf_event_open": 298,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "userfaultfd": 323,
        "syslog": 103,
        "pidfd_getfd": 438,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
    "aarch64": {
        "pivot_root": 41,
        "socket": 198,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 280,
        "perf_event_open": 241,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "userfaultfd": 282,
        "syslog": 116,
        "pidfd_getfd": 438,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
}.get(ARCH, {})
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(ARCH)
DENIED = [
    "ptrace",  # another process's memory and registers
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "io_uring_setup",  # io_uring opens sockets and connects without the socket syscall this filter reads
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "keyctl",  # the kernel keyrings: credentials of the user the node's processes run as
    "add_key",
    "request_key",
    "userfaultfd",
    "syslog",  # the kernel's log
]
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM = 1


def seccomp(families: tuple[int, ...], stream_only: bool = False) -> None:
    """Install a filter: the DENIED syscalls fail (EPERM), as does ``socket`` in any family but `families` (Unix
    sockets by address, pathname or abstract, and vsock among them; ``socketpair`` stays: it reaches nothing);
    `stream_only`: of those, only stream sockets (no UDP). Syscalls of another ABI (i386, x32) fail. Needs
    no_new_privs."""
    if AUDIT_ARCH is None:
        raise Refused(f"seccomp (no syscall table for {ARCH})", errno.ENOSYS)
    ld, jeq, ret, alu_and = 0x20, 0x15, 0x06, 0x54
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM
    code: list[tuple[int, int | str, int | str, int]] = [  # (op, jump if true, jump if false, k); str: a label
        (ld, 0, 0, 4),
        (jeq, 0, "deny", AUDIT_ARCH),
        (ld, 0, 0, 0),
        (0x35, "deny", 0, 0x40000000),  # jge: x32's numbers
        (jeq, "socket", 0, SYSCALLS["socket"]),
        *[(jeq, "deny", 0, SYSCALLS[name]) for name in DENIED],
        (ret, 0, 0, allow),
    ]
    labels = {"socket": len(code)}
    code += [(ld, 0, 0, 16), *[(jeq, "type" if stream_only else "allow", 0, f) for f in families], (ret, 0, 0, deny)]
    labels["type"] = len(code)
    code += [(ld, 0, 0, 24), (alu_and, 0, 0, 0xF), (jeq, "allow", "deny", SOCK_STREAM)]
    labels["allow"], labels["deny"] = len(code), len(code) + 1
    code += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    program = b""
    for i, (op, jt, jf, k) in enumerate(code):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        program += struct.pack("HBBI", op, jt, jf, k)
    buf = ctypes.create_string_buffer(program, len(program))
    prog = ctypes.create_string_buffer(struct.pack("HxxxxxxP", len(code), ctypes.addressof(buf)), 16)
    call(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0), "seccomp filter")


# --- Landlock: scopes, and (where there are no namespaces) writes and TCP -----------------------------------------

SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1, 2
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
FS_READ, FS_READ_FILE = 0b1101, 0b101
"""Landlock's rights to execute, read a file, read a folder; of those, the ones a rule on a file may hold."""
FS_WRITES = {1: 0b1_1111_1111_0010, 2: 1 << 13, 3: 1 << 14}
"""Landlock's write rights by the ABI that brought them: write a file, remove, make (ABI 1), refer (2), truncate
(3)."""
FS_WRITE_FILE = 0b10 | 1 << 14
"""Of those, the rights a rule on a file may hold: write, truncate."""


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock."""
    if "landlock_create_ruleset" not in SYSCALLS:
        return 0
    return max(0, _libc.syscall(SYSCALLS["landlock_create_ruleset"], None, 0, 1))


def landlock(read: list[str] | None, write: list[str] | None, tcp_ports: list[int] | None) -> list[str]:
    """Restrict this process and what it starts: signals and abstract Unix sockets to those of its own domain (ABI
    6); with `read`, reads of those paths only; with `write`, writes beneath those paths only; with `tcp_ports`, TCP
    connections to those ports only and no listening (ABI 4). Returns what the kernel's ABI could not restrict.
    Needs no_new_privs."""
    abi, missing = landlock_abi(), []
    if abi < 1:
        raise Refused("Landlock", errno.EOPNOTSUPP)
    writes = sum(bits for version, bits in FS_WRITES.items() if version <= abi)
    fs = (FS_READ if read is not None else 0) | (writes if write is not None else 0)
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if tcp_ports is not None and abi >= 4 else 0
    scoped = (SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL) if abi >= 6 else 0
    if tcp_ports is not None and not net:
        missing.append(f"TCP (Landlock ABI {abi} < 4)")
    if not scoped:
        missing.append(f"signals and abstract sockets (Landlock ABI {abi} < 6)")
    if not (fs or net or scoped):
        return missing
    attr = struct.pack("QQQ", fs, net, scoped)
    ruleset = call(
        _libc.syscall(SYSCALLS["landlock_create_ruleset"], attr, len(attr) if abi >= 6 else 16, 0), "Landlock ruleset"
    )
    try:
        rules = [(p, FS_READ) for p in read or []] + [
            (p, (FS_READ if read is not None else 0) | writes) for p in write or []
        ]
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    rights &= FS_READ_FILE | FS_WRITE_FILE
                rule = struct.pack("=Qi", rights & fs, fd)  # landlock_path_beneath_attr (packed): rights, the path
                call(_libc.syscall(SYSCALLS["landlock_add_rule"], ruleset, 1, rule, 0), f"Landlock rule {path}")
            finally:
                os.close(fd)
        for port in tcp_ports or [] if net else []:
            rule = struct.pack("QQ", NET_CONNECT_TCP, port)
            call(_libc.syscall(SYSCALLS["landlock_add_rule"], ruleset, 2, rule, 0), f"Landlock rule port {port}")
        call(_libc.syscall(SYSCALLS["landlock_restrict_self"], ruleset, 0), "Landlock restrict")
    finally:
        os.close(ruleset)
    return missing


CAP_DAC_READ_SEARCH = 2
PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, AMBIENT_RAISE, AMBIENT_CLEAR_ALL = 8, 24, 47, 2, 4


def drop_capabilities(keep: int | None = None) -> None:
    """Drop every capability but `keep` (a capability's number): the bounding set (``drop_bounding``), then the
    effective, permitted and inheritable sets; `keep` is made ambient, so that it passes to the programs this
    process runs."""
    drop_bounding(keep)
    set_capabilities(keep)


def drop_bounding(keep: int | None) -> None:
    """Drop every capability but `keep` from the bounding set, so that no program this process runs gains one back
    (this needs CAP_SETPCAP: before ``set_capabilities``)."""
    for cap in range(64):
        if cap != keep and _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() == errno.EINVAL:
            break


def set_capabilities(keep: int | None) -> None:
    """This process's capabilities: `keep` alone (effective, permitted, inheritable and ambient), or none."""
    _libc.prctl(PR_CAP_AMBIENT, AMBIENT_CLEAR_ALL, 0, 0, 0)
    bits = 0 if keep is None else 1 << keep
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0))  # _LINUX_CAPABILITY_VERSION_3, this
    data = ctypes.create_string_buffer(struct.pack("6I", bits, bits, bits, 0, 0, 0))  # effective, permitted, inh.
    call(_libc.capset(header, data), "capset")
    if keep is not None:
        call(_libc.prctl(PR_CAP_AMBIENT, AMBIENT_RAISE, keep, 0, 0), "ambient capability")

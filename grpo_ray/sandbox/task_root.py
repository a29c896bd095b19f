"""Run a command in a filesystem of its own: the node's, with given directories bound at fixed paths (a Harbor
task's /app, /logs, /tests), as a container would show them, with no container runtime. Run as a script, not
imported (it imports nothing of grpo-ray's, so that it starts in milliseconds)::

    python -I -S task_root.py [--no-network] NEWROOT /app=DIR [/logs=DIR ...] -- COMMAND [ARG ...]

It enters new user and mount namespaces (and, with --no-network, a network namespace of its own: a loopback that is
down, no route anywhere) (unprivileged; inside grpo-ray's sandbox too, whose read-only mounts stay
read-only here), makes a tmpfs at NEWROOT (an empty directory) the new root, binds each of the node's top-level
directories into it (its links as links), then each DIR at its path, enters it (chroot), changes to the first
path given and runs COMMAND. Without user namespaces it exits 125 saying why.
"""

import ctypes
import os
import sys

NEWUSER, NEWNS, NEWNET = 0x10000000, 0x00020000, 0x40000000
BIND, REC, PRIVATE = 4096, 16384, 1 << 18


def enter(newroot: str, binds: list[tuple[str, str]], network: bool = True) -> None:
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(NEWUSER | NEWNS | (0 if network else NEWNET)), "unshare (user namespaces)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    check(libc.mount(None, b"/", None, REC | PRIVATE, None), "mount --make-rprivate /")
    check(libc.mount(b"tmpfs", newroot.encode(), b"tmpfs", 0, None), f"tmpfs at {newroot}")
    ours = {at.strip("/").split("/")[0] for at, _ in binds}
    for name in sorted(os.listdir("/")):
        src, dst = "/" + name, os.path.join(newroot, name)
        if name in ours:
            continue
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
            check(libc.mount(src.encode(), dst.encode(), None, BIND | REC, None), f"bind {src}")
    for at, src in binds:
        dst = newroot + at
        os.makedirs(dst, exist_ok=True)
        check(libc.mount(src.encode(), dst.encode(), None, BIND | REC, None), f"bind {src} at {at}")
    os.chroot(newroot)
    os.chdir(binds[0][0])


if __name__ == "__main__":
    network = sys.argv[1] != "--no-network"
    args = sys.argv[1:] if network else sys.argv[2:]
    split = args.index("--")
    pairs = [tuple(a.split("=", 1)) for a in args[1:split]]
    try:
        enter(args[0], pairs, network)
    except OSError as e:
        print(f"task_root: {e.strerror}", file=sys.stderr)
        sys.exit(125)
    os.execvp(args[split + 1], args[split + 1 :])

"""The sandbox tried as an attacker would try it, from every kind of code it holds: a reward function, an
environment, an agent program and a Harbor task's command each run the escape attempts of tests/helpers/escape.py
(host Unix sockets by path, abstract and Ray's; TCP, UDP and vsock; the trainer's /proc and memory, signals,
ptrace; tokens in the environment, the process's own memory and files of the node; writes, remounts, symlinks out;
a fork bomb and a scratch flood) against what this test sets up on the node, and every one must be refused. The same
attempts without the sandbox reach what they aim at (the test can tell), and without user namespaces (the fallback
a container without them gets) each is refused or named missing in the isolation."""

import glob
import hashlib
import json
import os
import re
import socket
import socketserver
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from grpo_ray import sandbox
from grpo_ray.envs.agent_child import AgentChild
from grpo_ray.envs.child import EnvChild
from grpo_ray.rewards.child import RewardChild
from grpo_ray.sandbox import Jail
from tests.conftest import ROOT

PROBE = "tests.helpers.escape"
CAPS = {"memory_mb": 1024, "max_processes": 32, "scratch_mb": 16}
OWN = {"udp", "write /dev/shm", "the endpoint (handed)"}
"""Attempts whose outcome is read on the node (a datagram, a file) or that must succeed."""


class Node:
    """What the test sets up on the node for the attempts to reach: listeners, secrets, a trainer holding a token."""

    def __init__(self, tmp: Path, ray_sockets: list[str]):
        self.nonce = uuid.uuid4().hex[:12]
        secret = f"hf_escape_{self.nonce}"
        self.servers = []
        self.paths = [str(tmp / "host.sock"), str(ROOT / f".escape-{self.nonce}.sock")]  # /tmp, and a shown folder
        for path in self.paths:
            self.servers.append(self._listen(socket.AF_UNIX, path))
        self.servers.append(self._listen(socket.AF_UNIX, f"\0escape-{self.nonce}"))
        tcp = self._listen(socket.AF_INET, ("127.0.0.1", 0))
        self.servers.append(tcp)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.settimeout(0.2)
        self.trainer = subprocess.Popen(["sleep", "600"], env={**os.environ, "HF_TOKEN": secret})
        home = Path(os.path.expanduser("~")) / ".cache" / f"grpo-escape-{self.nonce}"
        home.parent.mkdir(parents=True, exist_ok=True)
        self.files = {"node file": tmp / "secret", "node /dev/shm": Path(f"/dev/shm/escape-src-{self.nonce}")}
        self.files["home file"] = home
        for path in self.files.values():
            path.write_text(secret)
        self.secret = secret
        self.targets = {
            "unix_paths": self.paths,
            "abstract": f"escape-{self.nonce}",
            "ray_sockets": ray_sockets,
            "tcp_port": tcp.getsockname()[1],
            "udp_port": self.udp.getsockname()[1],
            "secret_prefix": "hf_escape_",
            "secret_len": len(secret),
            "secret_sha": hashlib.sha256(secret.encode()).hexdigest(),
            "trainer_pid": self.trainer.pid,
            "files": {k: str(v) for k, v in self.files.items()},
            "shown_dir": str(ROOT),
            "nonce": self.nonce,
            "max_processes": CAPS["max_processes"],
            "scratch_mb": CAPS["scratch_mb"],
        }

    def _listen(self, family, address):
        s = socket.socket(family)
        s.bind(address)
        s.listen()
        return s

    def leaks(self) -> list[str]:
        """What reached the node (and is taken away): a datagram, a file in its /dev/shm."""
        out = []
        try:
            while True:
                out.append(f"a datagram arrived: {self.udp.recv(100)!r}")
        except TimeoutError:
            pass
        shm = Path(f"/dev/shm/escape-{self.nonce}")
        if shm.exists():
            out.append("a file was written to the node's /dev/shm")
            shm.unlink()
        return out

    def close(self):
        self.trainer.kill()
        for s in self.servers:
            s.close()
        for path in [*self.paths[1:], *self.files.values(), Path(f"/dev/shm/escape-{self.nonce}")]:
            Path(path).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def node(ray_local, tmp_path_factory, monkeypatch_module):
    """The node, with Ray running (its sockets under /tmp/ray) and tokens in the trainer's environment."""
    # the live session's sockets (old sessions' are dead files, and on a long-lived machine their paths outgrow one
    # command line: the Harbor probe carries the targets in its command)
    session = ray_local._private.worker._global_node.get_session_dir_path()
    ray_sockets = glob.glob(f"{session}/sockets/*")
    assert ray_sockets, "Ray is running: its sockets are there to be reached"
    n = Node(tmp_path_factory.mktemp("escape"), ray_sockets)
    monkeypatch_module.setenv("HF_TOKEN", n.secret)
    monkeypatch_module.setenv("WANDB_API_KEY", n.secret)
    yield n
    n.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def reached(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in OWN and not v.startswith("refused")}


def report_of(text: str) -> dict:
    found = re.search(r"EscapeReport: (\{.*\})", text) or re.search(r"ESCAPE-REPORT (\{.*\})", text)
    assert found, text[-3000:]
    return json.loads(found.group(1))


def from_reward(node: Node, jail: Jail) -> tuple[str, dict]:
    child = RewardChild(jail)
    try:
        outcome, result = child.run(([(f"{PROBE}:reward", [], node.targets)], "x", "y", {}), 120)
        assert outcome == "ok", outcome
        return child.isolation, report_of(result[3][f"{PROBE}:reward"])
    finally:
        child.close()


def from_environment(node: Node, jail: Jail) -> tuple[str, dict]:
    child = EnvChild(jail)
    try:
        row = {"extra_info": {"targets": node.targets}}
        outcome, opening = child.run(("reset", "e", f"{PROBE}:Probe", {}, row), 120)
        assert outcome == "ok", opening
        return child.isolation, json.loads(opening)
    finally:
        child.close()


class _Models(BaseHTTPRequestHandler):
    def do_GET(self):  # the endpoint's stand-in: any path answers
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


class _Endpoint(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def from_agent(node: Node, jail: Jail, tmp: Path) -> tuple[str, dict]:
    server = _Endpoint(str(tmp / f"endpoint-{uuid.uuid4().hex[:6]}.sock"), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    child = AgentChild(jail, server.server_address, f"{PROBE}:program")
    try:
        row = {"extra_info": {"targets": node.targets}}
        outcome, text = child.start("k", f"{PROBE}:program", {}, row, 120).result(150)
        assert outcome == "error", (outcome, text)
        return child.isolation, report_of(text)
    finally:
        child.close()
        server.shutdown()


def from_harbor(node: Node, jail: Jail, tmp: Path) -> tuple[str, dict]:
    task = tmp / f"task-{uuid.uuid4().hex[:6]}"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Escape.")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    jail.paths = [str(task)]
    child = EnvChild(jail)
    try:
        row = {"extra_info": {"task": str(task)}}
        options = {"output_chars": 100_000, "command_timeout_s": 120}
        assert child.run(("reset", "h", "harbor", options, row), 10) == ("ok", None)
        # the probe's source in the command (a checkout under /tmp is not in the task's filesystem: its /tmp is the
        # episode's), run by the node's python3 as a task's command would run it
        probe = (ROOT / "tests" / "helpers" / "escape.py").read_text()
        command = f"python3 - '{json.dumps(node.targets)}' <<'PROBE'\n{probe}\nPROBE"
        outcome, step = child.run(("step", "h", f"```bash\n{command}\n```"), 150)
        assert outcome == "ok", step
        return child.isolation, report_of(step["observation"])
    finally:
        child.close()


KINDS = ["reward", "environment", "agent program", "harbor command"]


def attempt(kind: str, node: Node, jail: Jail, tmp: Path) -> tuple[str, dict]:
    if kind == "reward":
        return from_reward(node, jail)
    if kind == "environment":
        return from_environment(node, jail)
    if kind == "agent program":
        return from_agent(node, jail, tmp)
    return from_harbor(node, jail, tmp)


@pytest.mark.parametrize("kind", KINDS)
def test_every_escape_is_refused(kind, node, tmp_path):
    isolation, report = attempt(kind, node, Jail(**CAPS), tmp_path)
    assert sandbox.complete(isolation), isolation
    assert len(report) >= 26, sorted(report)  # every attempt ran
    assert not reached(report), json.dumps(reached(report), indent=1)
    assert not node.leaks()
    if kind == "agent program":
        assert report["the endpoint (handed)"].startswith("reached"), report["the endpoint (handed)"]


def test_without_the_sandbox_the_same_attempts_reach_the_node(node, tmp_path):
    """The control: the attempts can tell a sandbox that holds from one that does not."""
    isolation, report = from_reward(node, Jail(**CAPS, sandbox=False))
    assert isolation == "none (turned off)"
    must = [
        f"unix path {node.paths[0]}",
        "unix abstract",
        "tcp",
        "trainer's /proc environ",
        "environment",
        "own /proc environ",
        "node file",
        "home file",
        "symlink out of scratch",
        f"write {ROOT}",
        "fork bomb",
    ]
    assert [k for k in must if not report[k].startswith("REACHED")] == [], {k: report[k] for k in must}
    assert len(node.leaks()) == 2


@pytest.mark.parametrize("kind", ["reward", "agent program"])
def test_without_user_namespaces_what_holds_is_said(kind, node, tmp_path):
    """The fallback (a node that refuses user namespaces, as many containers do): Landlock and seccomp hold the
    rest; the process cap cannot be had and the isolation says so, the fork bomb being the one attempt that goes
    through."""
    isolation, report = attempt(kind, node, Jail(**CAPS, namespaces=False), tmp_path)
    assert sandbox.held(isolation) == {"network", "filesystem", "sockets"}, isolation
    assert "a process cap" in isolation and "namespaces" in isolation
    assert set(reached(report)) == {"fork bomb"}, json.dumps(reached(report), indent=1)
    assert not node.leaks()
    if kind == "agent program":
        assert report["the endpoint (handed)"].startswith("reached"), report["the endpoint (handed)"]


def test_the_network_kept_keeps_the_rest(node, tmp_path):
    """reward.network / environment.network: the node's network is reachable, nothing else is."""
    isolation, report = from_reward(node, Jail(**CAPS, network=True))
    assert sandbox.complete(isolation, network=True), isolation
    assert report["tcp"].startswith("REACHED")
    assert set(reached(report)) == {"tcp"}, json.dumps(reached(report), indent=1)
    assert any("datagram" in leak for leak in node.leaks())  # UDP goes out too, as the network was asked for


def test_nothing_is_left_behind_on_the_node(node):
    """Children come and go (started, replaced, closed) and leave no folder of theirs in the node's /tmp."""
    before = set(glob.glob("/tmp/grpo-*"))
    for jail in (Jail(**CAPS), Jail(**CAPS, namespaces=False)):
        child = RewardChild(jail)
        child.run(([("gsm8k", [], {})], "#### 1", "1", {}), 10)
        child.restart()
        child.close()
    assert set(glob.glob("/tmp/grpo-*")) == before


def test_a_layer_the_kernel_refuses_is_said_once_on_the_console(capsys):
    """Before start, the run says what the sandbox misses on this node (here: the fallback, forced), in one line."""
    from grpo_ray.config import RewardConfig
    from grpo_ray.preflight import say_isolation

    child = RewardChild(Jail(**CAPS, namespaces=False))
    child.close()
    say_isolation("reward", child.isolation, RewardConfig())
    say_isolation("reward", sandbox.FULL, RewardConfig())  # a whole sandbox: nothing said
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "reward code's sandbox on this node" in lines[0] and "missing: namespaces" in lines[0]


def test_a_run_from_another_folder_finds_grpo_ray_in_the_jail(tmp_path):
    """An editable install finds grpo_ray by an import hook, not by a folder on sys.path: a command started outside
    the checkout (a user's project folder) has no folder of the package's on its path, and the jail shows the package
    all the same (it failed to start there: `No module named 'grpo_ray.envs'`)."""
    script = (
        "import sys\n"
        f"assert not any(p.rstrip('/') == {str(ROOT)!r} for p in sys.path), sys.path\n"
        "from grpo_ray.sandbox import Jail\n"
        "from grpo_ray.rewards.child import RewardChild\n"
        "child = RewardChild(Jail(512))\n"
        "print(child.run(([('gsm8k', [], {})], '#### 1', '1', {}), 10))\n"
        "child.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1.0" in done.stdout, done.stdout


def jailed_processes() -> set[int]:
    """The node's processes that run a sandboxed child's code: the warden's program, in a PID namespace of its own."""
    found = set()
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            text = Path(status).read_text()
            cmdline = Path(status).with_name("cmdline").read_bytes()
        except OSError:
            continue
        nspid = re.search(r"^NSpid:\s+(.*)$", text, re.M)
        if b"grpo_ray.sandbox.warden" in cmdline and nspid and len(nspid.group(1).split()) > 1:
            found.add(int(Path(status).parent.name))
    return found


def test_a_child_replaced_or_closed_leaves_none_of_its_code_running():
    """An environment whose step hangs costs its process, which is replaced; the replacement is closed. The user's
    code they ran ends with them: the jail's process runs as the jail's user, and a change of user clears the
    parent-death signal, so it is set again after it (before, a hung step outlived its run, asleep, as nobody)."""
    import time

    sys.path.insert(0, str(ROOT))
    before = jailed_processes()
    child = EnvChild(Jail(512))
    try:
        assert child.run(("reset", "k", "tests.helpers.envs:Hang", {}, {}), 5) == ("ok", None)
        assert child.run(("step", "k", "hello"), 1.0)[0] == "timeout"  # the process is replaced
        assert child.run(("reset", "k", "tests.helpers.envs:Hang", {}, {}), 5) == ("ok", None)
    finally:
        child.close()
    deadline = time.monotonic() + 10
    while (left := jailed_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]

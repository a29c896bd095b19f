"""``harbor``: Harbor tasks (a directory: ``instruction.md``, ``task.toml``, ``environment/``, ``tests/test.sh``),
the model working in the task's shell, with no glue and no container runtime::

    data.train_files=[harbor://path/to/tasks]     # one task's directory, or a directory of them
    environment.name=harbor

Each task is a row: a system message saying how to use the shell, then ``instruction.md`` as the user's message,
data_source ``harbor/<task name>``, no ground truth (the task's tests score it) and ``extra_info.task`` its
directory. An episode is a trial, as Harbor runs one, on this node's own tools (a local process runtime):

- each model turn runs the commands of its last fenced ``bash`` block in the task's ``/app`` (empty at the start),
  with a writable ``/logs`` and ``/tmp`` of the episode's own (``grpo_ray/sandbox/task_root.py`` makes the paths
  without a container), ``options.command_timeout_s`` each, and the observation is the exit code and the output's
  last ``options.output_chars`` characters;
- a turn with no such block says the task is done, as does the last turn (the turn limit's, or one cut at the
  token limit, whose commands are not run): then the task's ``tests/`` are copied to ``/tests`` and
  ``bash /tests/test.sh`` runs (``[verifier] timeout_sec`` and ``env`` of ``task.toml``), and the reward is the
  number it wrote to ``/logs/verifier/reward.txt``, or the ``reward`` of ``/logs/verifier/reward.json``. A test
  that writes neither fails the episode with its output, counted, as do tests that call a command the node does
  not have (bash's ``command not found``: whatever the script's fallback wrote is not the answer's score).

Tests that install at verify time (``apt-get install``, ``curl ... | sh``, ``uvx``, ``pip install``: harbor-cookbook's
usual ``tests/test.sh``) are refused before start where ``environment.network`` is false, naming the task and the line.
With it true, ``options.network: verifier`` keeps the network from the turns' commands (a network namespace each)
and gives it to the tests alone, as a container runtime's verifier phase has it.

Commands see only PATH, HOME (/tmp), LANG and TERM of the generator's environment: no token reaches them. What a
container runtime adds, and this does not: the image the Dockerfile builds (its packages, the files it copies, its
WORKDIR), its process and network isolation (here, grpo-ray's sandbox: a read-only filesystem, no network unless
``environment.network``), and its CPU and memory limits (here, the environment process's memory cap).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import typing
from pathlib import Path

import pydantic
import tomllib

from grpo_ray.envs.base import Environment, Step

SYSTEM = (
    "You are working in a Linux shell; the working directory is /app. Each reply of yours runs the commands of its "
    "last ```bash block and shows you their exit code and output. When the task is done, reply without a bash block."
)
COMMANDS = re.compile(r"```(?:bash|sh|shell)[ \t]*\n(.*?)```", re.DOTALL)
ROOT = Path(__file__).parents[1] / "sandbox" / "task_root.py"
INSTALLS = re.compile(
    r"\b(?:apt-get|apt|yum|dnf|apk|brew|conda|mamba)\s+(?:-\S+\s+)*(?:install|update|add)\b"
    r"|\b(?:curl|wget)\b[^|\n]*\|\s*(?:sudo\s+)?(?:ba|z)?sh\b"
    r"|\b(?:pip3?|pipx)\s+install\b|\buvx\b|\buv\s+(?:pip\s+install|tool\s+install|run|sync|add|venv)\b"
    r"|\bnpm\s+(?:install|i|ci)\b|\bnpx\b"
)
"""A command that fetches tools or packages: a package manager's, an installer piped to a shell, pip, uv, npm."""
MISSING = re.compile(r"^/tests/\S+: line (\d+): (.+): command not found$", re.MULTILINE)
"""bash's line for a command the node does not have (exit 127), as a task's test script shows it."""


def tasks(path: Path) -> list[Path]:
    """The task directories at `path`: itself when it holds instruction.md, else its subdirectories that do;
    ValueError naming what is missing."""
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory (a Harbor task's, or one holding tasks)")
    found = [path] if (path / "instruction.md").is_file() else sorted(p for p in path.iterdir() if p.is_dir())
    for task in found:
        missing = [f for f in ("instruction.md", "tests/test.sh") if not (task / f).is_file()]
        if missing:
            raise ValueError(f"{task} is not a Harbor task: it has no {' and no '.join(missing)}")
    if not found:
        raise ValueError(f"{path} holds no Harbor task (a directory with instruction.md and tests/test.sh)")
    return found


def config(task: Path) -> dict:
    """task.toml's contents ({} without one); ValueError where it does not parse."""
    try:
        return tomllib.loads((task / "task.toml").read_text()) if (task / "task.toml").is_file() else {}
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{task / 'task.toml'}: {e}") from None


def installs(task: Path) -> list[str]:
    """The lines of the task's tests/test.sh that fetch tools or packages at verify time, as 'line N: TEXT'
    (comments aside)."""
    lines = (task / "tests" / "test.sh").read_text(errors="replace").splitlines()
    return [f"line {i}: {t.strip()}" for i, t in enumerate(lines, 1) if INSTALLS.search(t.split("#", 1)[0])]


SCHEME = "harbor://"


def specs(recipe) -> list[str]:
    """The recipe's ``harbor://`` data specs, training's and validation's."""
    return [s for s in (*recipe.data.train_files, *recipe.data.val_files) if s.startswith(SCHEME)]


def check(specs: list[str], network: bool, options: dict) -> None:
    """Before start, for the ``harbor://`` `specs` played with `options` where the environment's network is
    `network`: ValueError where ``options.network: verifier`` has no network to give, or naming the first task whose
    tests install at verify time without the network (they would fail there and score what their fallback writes,
    0, not the answer). Specs that are not tasks are the data check's to refuse."""
    if options.get("network") == "verifier" and not network:
        raise ValueError(
            "environment.options.network=verifier gives the tests the environment's network, and "
            "environment.network is false: there is none to give (set environment.network=true)"
        )
    if network:
        return
    for spec in specs:
        try:
            found = tasks(Path(spec.removeprefix(SCHEME)).resolve())
        except ValueError:
            continue
        for task in found:
            fetched = installs(task)
            if fetched:
                raise ValueError(
                    f"the Harbor task {task} installs at verify time (tests/test.sh {fetched[0]}): a trial here runs "
                    "on the node's own tools, without a container, and with environment.network false its tests "
                    "cannot fetch anything, so they would fail and score 0 whatever the model did. Put the tools "
                    "the tests use on the node and take the install out of test.sh, or set environment.network=true "
                    "(with environment.options.network=verifier: the tests alone reach it) where the install needs no "
                    "root (uv or pip into HOME; apt-get cannot install here)"
                )


def rows(spec: str) -> list[dict]:
    """The rows of a ``harbor://PATH`` spec (a relative PATH from the working directory); ValueError saying what
    is wrong (the data layer says it as the spec's DataError)."""
    out = []
    for i, task in enumerate(tasks(Path(spec.removeprefix(SCHEME)).resolve())):
        name = config(task).get("task", {}).get("name") or task.name
        instruction = (task / "instruction.md").read_text()
        out.append(
            {
                "data_source": f"harbor/{name}",
                "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}],
                "reward_model": {"style": "rule", "ground_truth": ""},
                "extra_info": {"index": i, "task": str(task)},
            }
        )
    return out


@functools.cache
def kept_home() -> str:
    """This process's folder for the tests' HOME under ``options.verifier_cache`` (made on first use, in its
    scratch; gone with the process's scratch)."""
    home = tempfile.mkdtemp(prefix="harbor-home-")
    atexit.register(shutil.rmtree, home, True)  # (outside a sandbox, the node's /tmp)
    return home


@contextlib.contextmanager
def script_file(script: str | None):
    """`script` in a file of memory (none on disk): its descriptor, for a child to read as /dev/fd/N; none without."""
    if script is None:
        yield ()
        return
    fd = os.memfd_create("command")
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(script.encode())
        yield (fd,)
    finally:
        os.close(fd)


def read_tail(stream, keep: int, out: list) -> None:
    """Read `stream` to its end, keeping its last `keep` bytes in out[0] as it goes."""
    for chunk in iter(lambda: stream.read1(1 << 16), b""):
        out[0] = (out[0] + chunk)[-keep:]
    stream.close()


class Harbor(Environment):
    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        command_timeout_s: float = pydantic.Field(30.0, gt=0)
        """Each turn's commands' time limit (killed past it, the observation says so)."""
        output_chars: int = pydantic.Field(2000, gt=0)
        """How much of a turn's output (stdout and stderr, in order) the observation keeps: its end."""
        verifier_timeout_s: float = pydantic.Field(120.0, gt=0)
        """The tests' time limit where task.toml's ``[verifier] timeout_sec`` does not say one."""
        network: typing.Literal["all", "verifier"] = "all"
        """Where ``environment.network`` is true, who reaches it: ``all`` (the turns' commands and the tests) or
        ``verifier`` (the tests alone, as tests that install as they verify need; each turn's commands run in a
        network namespace of their own, with none)."""
        verifier_cache: bool = False
        """The tests' HOME (``/cache``) kept from episode to episode of an environment process, so that what they
        install there (uv, its package and Python caches) is fetched once; the turns' commands never see it. It
        lives in the process's scratch (``environment.scratch_mb``)."""

    @classmethod
    def check_recipe(cls, recipe, options: dict) -> None:
        check(specs(recipe), recipe.environment.network, options)

    @classmethod
    def shown(cls, recipe) -> list[str]:
        return [s.removeprefix(SCHEME) for s in specs(recipe)]

    def reset(self, row: dict) -> None:
        task = (row.get("extra_info") or {}).get("task")
        if not task or not Path(task).is_dir():
            raise ValueError(f"harbor episodes play rows of harbor:// data (extra_info.task), given {task!r}")
        self.task, self.config = Path(task), config(Path(task))
        self.dir = Path(tempfile.mkdtemp(prefix="harbor-"))
        for sub in ("app", "logs/agent", "logs/verifier", "tmp", "root"):
            (self.dir / sub).mkdir(parents=True)

    def step(self, turn: str, truncated: bool = False, last: bool = False) -> Step:
        found = COMMANDS.findall(turn)
        if found and not truncated:
            limit = self.options.command_timeout_s
            code, output = self.run(["bash"], limit, network=self.options.network == "all", script=found[-1])
            said = f"exit code {code}" if code is not None else f"timed out after {limit} s"
            if not last:
                return Step(f"{said}\n{output[-self.options.output_chars :]}", tool_call=True, tool_error=code != 0)
        return Step(reward=self.verify(), done=True)

    def verify(self) -> float:
        """Run the task's tests (a fresh copy at /tests); the reward they wrote."""
        shutil.copytree(self.task / "tests", self.dir / "tests")
        verifier = self.config.get("verifier", {})
        timeout = float(verifier.get("timeout_sec", self.options.verifier_timeout_s))
        code, output = self.run(["bash", "/tests/test.sh"], timeout, tests=True, env=verifier.get("env", {}))
        missing = MISSING.findall(output)
        if missing:  # their verdict is on the node, not on the answer (a fallback writes 0)
            said = ", ".join(f"{cmd!r} (test.sh line {line})" for line, cmd in missing)
            raise RuntimeError(
                f"{self.task.name}'s tests could not run here: {said} not found on this node; what they wrote is "
                f"not taken as the reward:\n{output[-2000:]}"
            )
        logs = self.dir / "logs" / "verifier"
        for name in ("reward.txt", "reward.json"):
            if (logs / name).is_file():
                text = (logs / name).read_text()
                try:
                    said = json.loads(text) if name == "reward.json" else float(text.strip())
                except ValueError:
                    raise ValueError(f"{self.task.name}'s tests wrote {name} {text[:200]!r}: not a number") from None
                if not isinstance(said, dict):
                    return float(said)
                if "reward" in said or len(said) == 1:
                    return float(said.get("reward", next(iter(said.values()))))
                raise ValueError(
                    f"{self.task.name}'s tests wrote rewards {sorted(said)}: which is the reward is unsaid"
                )
        ended = f"exit code {code}" if code is not None else f"timed out after {timeout} s"
        raise RuntimeError(
            f"{self.task.name}'s tests ({ended}) wrote no /logs/verifier/reward.txt or reward.json:\n{output[-2000:]}"
        )

    def run(
        self,
        argv: list[str],
        timeout: float,
        tests: bool = False,
        env: dict | None = None,
        network: bool = True,
        script: str | None = None,
    ) -> tuple:
        """`argv` in the task's filesystem (without `network`: in a network namespace of its own), a `script` given
        as a last argument, the path of a file of memory holding it: (its exit code, or None past `timeout`; its
        output)."""
        paths = ["app", "logs", "tmp", *(["tests"] if tests else [])]
        binds = [f"/{p}={self.dir / p}" for p in paths]
        keep = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
        keep["HOME"] = "/tmp"
        if tests and self.options.verifier_cache:
            binds.append(f"/cache={kept_home()}")
            keep["HOME"] = "/cache"
        alone = [] if network else ["--no-network"]
        with script_file(script) as fds:  # (an argument holds at most 128 KiB; a model's command may hold more)
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(ROOT), *alone, str(self.dir / "root"), *binds, "--", *argv]
                + [f"/dev/fd/{fd}" for fd in fds],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**keep, **{str(k): str(v) for k, v in (env or {}).items()}},
                start_new_session=True,
                pass_fds=fds,
            )
        tail = [b""]  # the output's last bytes, read as it comes (a flood costs no memory)
        most = 4 * max(self.options.output_chars, 2000)
        reader = threading.Thread(target=read_tail, args=(proc.stdout, most, tail), daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        with contextlib.suppress(ProcessLookupError):  # what it left running in the background too
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=5)  # (a process that left the group holds the pipe: what came by then)
        text = tail[0].decode(errors="replace")
        if code == 125 and text.startswith("task_root:"):
            raise RuntimeError(f"a Harbor task's filesystem could not be made here: {text.strip()}")
        return code, text

    def close(self) -> None:
        if getattr(self, "dir", None):
            shutil.rmtree(self.dir, ignore_errors=True)

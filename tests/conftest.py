import os
import sys
from pathlib import Path

import pytest

from tests.watchdog import Watchdog

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
TINY = "tiny://{arch}?layers=2&hidden=64&heads=2&kv_heads=1&intermediate=128&seed=0"


def engine_env() -> dict[str, str]:
    """The environment of a process a test starts to run a vLLM engine (enforce_eager) in itself, as a CPU generator
    actor's process runs one (``Device.engine_env``: nothing compiled), its threads this machine's cores."""
    from grpo_ray.device import Device

    return {**os.environ, **Device("cpu").engine_env(len(os.sched_getaffinity(0)), eager=True)}


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        help="the full suite: every test, the end-to-end runs of every feature included, with no session limit "
        "(the default is CI's tier: pyproject's -m 'not slow or smoke' under its session_timeout)",
    )


@pytest.hookimpl(trylast=True)  # after pytest-timeout has set its session limit
def pytest_configure(config):
    if config.getoption("full"):
        from pytest_timeout import SESSION_EXPIRE_KEY

        config.option.markexpr = ""
        config.stash[SESSION_EXPIRE_KEY] = 0  # no session limit
    config.pluginmanager.register(Watchdog(config), "watchdog")


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    """Tiny models of the whole session are built once, in a temporary cache (also seen by child processes)."""
    path = tmp_path_factory.mktemp("grpo_ray_cache")
    old = os.environ.get("GRPO_RAY_CACHE")
    os.environ["GRPO_RAY_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("GRPO_RAY_CACHE", None)
    else:
        os.environ["GRPO_RAY_CACHE"] = old


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"the shared data folder {SHARED_DATA} is absent (it sits beside the checkout in CI)")
    return SHARED_DATA


def run_cli(*args, env=None, cwd=None, timeout=600):
    """Run `python -m grpo_ray ARGS` in a child process; return the CompletedProcess."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "grpo_ray", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd or ROOT,
        timeout=timeout,
    )


def plan_cli(*args):
    """`grpo-ray plan ARGS` in this process (a plan starts nothing; a child process would spend seconds importing
    what this one holds): the exit code, stdout and stderr, as run_cli's CompletedProcess has them."""
    import contextlib
    import io
    import subprocess

    from grpo_ray.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["plan", *args])
        except SystemExit as e:  # argparse's refusals
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(["grpo-ray", "plan", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray cluster for one test module (logical CPUs: actors here are mostly idle)."""
    import ray

    from grpo_ray.jobs.launch import PRESTART_OFF

    for var in PRESTART_OFF:  # as a run's own local cluster: no idle workers started ahead of the actors
        os.environ.setdefault(var, "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def tiny_rollouts(vocab: int, prompts: int = 4, group: int = 4, seed: int = 0, split: int = 2):
    """Hand-made rollouts of random tokens (for learner and sync tests), cut into `split` rollouts."""
    import random

    from grpo_ray.types import Completion, Prompt, Rollout

    rng = random.Random(seed)
    out = []
    per = prompts // split
    for _ in range(split):
        ps = [Prompt([rng.randrange(3, vocab) for _ in range(rng.randint(4, 9))], "1", "test") for _ in range(per)]
        cs = []
        for i in range(per):
            for _ in range(group):
                ids = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 5))]
                cs.append(Completion(i, ids, "", [-rng.uniform(4, 7) for _ in ids], "stop"))  # a sampler's logprobs
        out.append(Rollout(ps, cs, 0))
    return out


ONE_STEP_OFF = ["algorithm.max_staleness=1", "algorithm.rollout_correction.rollout_is=token"]
LEAN = ["algorithm.kl_coef=0", "learner.world_size=1"]
"""No KL term (so no reference actor) and one learner rank: a smoke run whose path is neither of those pools starts two
actors fewer (docs/testing.md, "Lean smoke runs")."""
RESUMED = [*ONE_STEP_OFF, "trainer.dump_freq=1"]
"""resumed_runs' overrides beside tests/test_checkpoint.py's COMMON (tests/test_sync.py repeats its run on storage)."""


@pytest.fixture(scope="session")
def resumed_runs(tmp_path_factory):
    """One step off, with dumps: an uninterrupted 4-step run and the same run SIGKILLed after step 2's checkpoint,
    then resumed (tests/test_checkpoint.py's whole_and_resumed); shared by test_checkpoint, test_async and test_sync
    (the uninterrupted run is the collective transport's side of the storage transport's comparison)."""
    from tests.test_checkpoint import whole_and_resumed

    return whole_and_resumed(tmp_path_factory, RESUMED)

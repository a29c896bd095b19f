"""The commands docs/environments.md gives, run as written (issue 75 item 5): each ``grpo-ray train`` line of its bash
blocks, with the page's own ``my_env.py`` in the working directory, for two steps (``trainer.total_steps=2``, an
output folder of the test's; nothing else changed; the slow tier). Each run ends well and no episode fails. Two
commands are run elsewhere, named below, and why. The page's own environment scores as the page says (in process)."""

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

PAGE = ROOT / "docs" / "environments.md"
ELSEWHERE = {
    "tiny-cpu-reasoning-gym.yaml": "its SFT warm start first: tests/test_reasoning_gym.py's showcase test runs it",
    "verifiers://my_taskset": "a taskset of the user's: tests/test_verifiers.py runs this command on its toy tasksets",
}


def commands() -> list[str]:
    """Each `grpo-ray train` command of the page's bash blocks, its continuation lines joined, comments cut."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.DOTALL):
        text = re.sub(r"\\\n\s*", " ", block)
        out += [line.split("  #")[0].strip() for line in text.splitlines() if "grpo-ray train " in line]
    return out


def test_the_page_gives_the_commands_this_file_runs():
    """A command added to the page is run here (or named in ELSEWHERE with its reason)."""
    found = commands()
    assert len(found) == 6, found
    assert sum(any(k in c for k in ELSEWHERE) for c in found) == len(ELSEWHERE)


def page_module(tmp_path: Path) -> Path:
    """The page's own my_env.py, written into `tmp_path`."""
    source = re.search(r"```python\n(# my_env\.py.*?)```", PAGE.read_text(), re.DOTALL).group(1)
    (tmp_path / "my_env.py").write_text(source)
    return tmp_path / "my_env.py"


def test_the_pages_environment_scores_as_the_page_says(tmp_path):
    """Countdown, as written on the page: the target said ends the episode with 1 + the bonus (0.2, as the page's
    command sets it); anything else is answered "Not yet" at -0.1."""
    import importlib.util

    from grpo_ray.envs import options

    spec = importlib.util.spec_from_file_location("my_env", page_module(tmp_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = module.Countdown(options(module.Countdown, {"bonus": 0.2}))
    env.reset({"ground_truth": "42", "data_source": "x", "extra_info": {}, "prompt": "..."})
    miss = env.step("It is 41.")
    assert (miss.observation, miss.reward, miss.done) == ("Not yet: try again.", -0.1, False)
    hit = env.step("The answer is 42.")
    assert hit.reward == pytest.approx(1.2) and hit.done


RUN = [c for c in commands() if not any(k in c for k in ELSEWHERE)]


@pytest.mark.slow
@pytest.mark.parametrize("command", RUN, ids=[re.search(r"environment.name=(\S+)", c).group(1) for c in RUN])
def test_a_documented_command_runs_as_written(command, tmp_path):
    page_module(tmp_path)  # "beside the recipe or in the working directory"
    args = shlex.split(command)[1:]  # `train` and what follows
    args = [
        a.replace("recipes/", f"{ROOT}/recipes/", 1).replace("harbor://tests/", f"harbor://{ROOT}/tests/") for a in args
    ]
    out = tmp_path / "run"
    res = run_cli(*args, "trainer.total_steps=2", f"trainer.output_dir={out}", cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = steps[-1]
    assert last["step"] == 2 and last["env/errors"] == 0 and last["env/timeouts"] == 0
    assert Path(out / "rollouts").is_dir()

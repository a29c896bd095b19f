"""The package's import structure: no module imports one above its layer, and no import circle, counting the
imports written inside functions (the ones that hid `models.resolve` -> `sft`: resolving a model name could run a
whole SFT job). A new module goes into LAYERS; a failure names the import to move."""

import ast
from pathlib import Path

from tests.conftest import ROOT

LAYERS = [  # bottom to top: a module imports modules of its own layer or below, never above
    (
        "base",
        [
            "errors",
            "types",
            "faults",
            "telemetry.perf",
            "device",
            "config",
            "recipe_docs",
            "sync",
            "telemetry.plot",
            "libraries",  # the outside libraries' module:name strings: found by name, never imported below them
            "sandbox",  # untrusted code in a child process that reaches nothing it was not handed
        ],
    ),
    ("data", ["data"]),  # rows, chat templates, the tokens a job's rows carry
    ("rewards", ["rewards"]),  # reward functions: plain callables, in the reward actors' children
    ("envs", ["envs"]),  # what answers the model between its turns, and its sandboxed children
    ("integrations", ["integrations"]),  # one module per outside library: its rows, adapter, reward and options
    (
        "pure",
        [
            "algo",
            "models",  # names, tiny checkpoints built offline, shapes, LoRA
            "schedules",  # when batches launch, weights are pushed and the old policy recomputed
            "lengths",  # token budgets, contexts and engine caches a recipe implies: the runtime's and the planner's
            "placement",
            "planner",  # plan's memory and time models (its calibration is a job: below)
            "telemetry",  # metrics, trackers, rollout dumps
            "transports",
            "checkpoint",
            "rundir",
            "early_stop",
        ],
    ),  # no Ray actors started, no training
    ("rollouts", ["rollouts"]),  # the rollout runtime on an engine it is given: episodes, agent programs, endpoint
    ("roles", ["roles", "keeper"]),  # one Ray actor class per role (and the learner's copies' keeper)
    (
        "pools",
        ["pools", "engines", "scorers", "sources", "extend"],
    ),  # the actors started, placed and called; a step's batches; a plugin's rows
    ("run", ["runner", "controller", "setup_run", "preflight"]),  # one run's inputs and its step
    # jobs made of runs (an sft:// warm start is trained here); plan --calibrate runs the roles' own code in processes
    # of its own
    ("job", ["jobs", "planner.calibrate", "planner.measure", "planner.command"]),
    ("cli", ["cli", "__main__"]),
]


def modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "grpo_ray").rglob("*.py"):
        parts = path.relative_to(ROOT / "grpo_ray").with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def layer_of(module: str) -> int:
    """The layer of the longest name in LAYERS that `module` is or lies under (planner.calibrate before planner)."""
    named = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}
    for name in sorted(named, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return named[name]
    raise AssertionError(f"grpo_ray.{module} is in no layer: add it to LAYERS in {__file__}")


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other grpo_ray modules, at any depth of its code."""
    graph = {}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(["grpo_ray", *package[: len(package) - node.level + 1], *([base] if base else [])])
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if name == "grpo_ray" or not name.startswith("grpo_ray."):
                    continue
                name = name.removeprefix("grpo_ray.")
                while name and name not in mods:  # `from grpo_ray.x import function` names module x
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    found.add(name)
        graph[mod] = found
    return graph


def test_no_module_imports_above_its_layer():
    mods = modules()
    upward = [
        f"grpo_ray.{m} ({LAYERS[layer_of(m)][0]}) imports grpo_ray.{d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in sorted(imports(mods).items())
        if m
        for d in sorted(deps)
        if layer_of(d) > layer_of(m)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    graph = imports(modules())
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str]:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d] if d in path else [m, d]
            if d not in state and (circle := visit(d, [*path, d])):
                return circle
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state and (circle := visit(m, [m])):
            raise AssertionError("import circle: " + " -> ".join(f"grpo_ray.{x}" for x in circle))


PLANNER = "planner"
"""`grpo-ray plan`'s memory and time models and its calibration: read by the CLI before start, never by the runtime."""


def test_the_runtime_does_not_import_the_planner():
    """The roles, pools and the run (controller, runner, set-up) take the recipe's facts (response budget, context,
    KV cache) from `lengths`, not from the planner: a change to how plan predicts cannot change how a run runs."""
    runtime = {i for i, (name, _) in enumerate(LAYERS) if name in ("roles", "pools", "run")}
    graph = imports(modules())
    found = [
        f"grpo_ray.{m} imports grpo_ray.{d}"
        for m, deps in sorted(graph.items())
        if m and layer_of(m) in runtime
        for d in sorted(deps)
        if d.split(".")[0] == PLANNER
    ]
    assert not found, "\n".join(found)


def test_the_checks_catch_what_they_are_for(tmp_path, monkeypatch):
    """The walk sees an import inside a function, and the layers refuse it: the import that made the circle."""
    fake = ROOT / "grpo_ray" / "models" / "__init__.py"
    text = fake.read_text() + "\n\ndef _f():\n    from grpo_ray.jobs.sft import warm_start\n"
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if self == fake else real_read(self, *a, **k))
    graph = imports(modules())
    assert "jobs.sft" in graph["models"]
    try:
        test_no_module_imports_above_its_layer()
    except AssertionError as e:
        assert "grpo_ray.models (pure) imports grpo_ray.jobs.sft (job)" in str(e)
    else:
        raise AssertionError("an upward import inside a function passed")
    try:
        test_no_import_circle()
    except AssertionError as e:
        assert "import circle:" in str(e) and "grpo_ray.jobs.sft" in str(e)
    else:
        raise AssertionError("the circle models -> sft -> ... -> models passed")


def test_the_device_is_one_value():
    """No module asks the machine what it runs on: the run's device is grpo_ray.device.Device, built from
    cluster.device. The exceptions: `eval` without a recipe, which takes this machine's GPUs as its recipe, and
    `plan --calibrate`, which measures this machine and first checks that it has the device asked for."""
    asked = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("is_available", "device_count"):
                if ast.unparse(node.value).endswith("cuda") and mod not in ("jobs.evaluate", "planner.calibrate"):
                    asked.append(f"grpo_ray/{path.relative_to(ROOT / 'grpo_ray')}:{node.lineno}: {ast.unparse(node)}")
    assert not asked, "\n".join(asked)


def test_ruff_lints_and_formats_clean():
    """The configuration is pyproject.toml's [tool.ruff]; `ruff format . && ruff check --fix .` repairs most."""
    import subprocess
    import sys

    for args in (["check", "--output-format", "concise", "."], ["format", "--check", "."]):
        res = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
        assert res.returncode == 0, f"ruff {' '.join(args)}:\n{res.stdout[-3000:]}{res.stderr[-1000:]}"


def test_the_docs_links_resolve():
    """Every relative link in the README, docs/ and benchmarks/README.md names a file that exists, and every
    #anchor a heading of that page (GitHub's slugs)."""
    import re

    def slugs(page: Path) -> set[str]:
        heads = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}

    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in slugs(dest)):
                broken.append(f"{page.relative_to(ROOT)}: ({target})")
    assert not broken, "\n".join(broken)


def test_the_readme_is_a_guide_of_at_most_250_lines():
    """The README leads a new user through the quick start and points to docs/ for each feature (issue 54): a
    feature's essay grows its page there, not the README."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move what a feature's page can hold into docs/"


def test_no_package_file_or_function_grows_past_its_budget():
    """No file of the package over 500 lines; no function over 60, but the CLI's argument table: a junction that
    keeps growing is the sign a seam is missing (split it where its parts are, as the planner's files are)."""
    big_files = [
        f"{p.relative_to(ROOT)}: {n}" for p in modules().values() if (n := len(p.read_text().splitlines())) > 500
    ]
    assert not big_files, "over 500 lines: " + ", ".join(big_files)
    long = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (mod, node.name) != ("cli", "parser"):
                if (n := node.end_lineno - node.lineno + 1) > 60:
                    long.append(f"grpo_ray.{mod}.{node.name}: {n} lines")
    assert not long, "\n".join(long)


OTHER_MEANINGS = {
    "reward_model": (
        "data",
        "types",
        "setup_run",
        "jobs.evaluate",
        "rewards.learned",
        "integrations",
    ),  # verl's row field, a component, a library's rows
    "reward": (
        "envs",
        "integrations",
        "rollouts.episodes",
        "telemetry.metrics",
        "telemetry.trackers",
    ),  # an environment's reward, a table's column
}
"""Modules where a pool kind's name is a word of another meaning, not a pool: verl's data rows carry a reward_model
field (the reward component of the reward model is named after it), and an environment's step returns a reward."""


def pool_name_literals() -> list[str]:
    """String constants equal to a pool kind's name, outside the table (config.pools) and the role map
    (pools.ROLES), and outside the modules where the word means something else (OTHER_MEANINGS)."""
    from grpo_ray.config import POOLS

    found = []
    for mod, path in modules().items():
        if mod == "config.pools":
            continue
        tree = ast.parse(path.read_text())
        roles = [n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "ROLES"]
        skip = {id(c) for r in roles for c in ast.walk(r)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in POOLS and id(node) not in skip:
                other = OTHER_MEANINGS.get(node.value, ())
                if not any(mod == m or mod.startswith(m + ".") for m in other):
                    found.append(f"grpo_ray/{path.relative_to(ROOT / 'grpo_ray')}:{node.lineno}: {node.value!r}")
    return found


def test_pools_are_named_in_the_table_not_in_the_code():
    """A pool's facts are its row: code that does something for every pool loops over KINDS, and code that means one
    pool names it by the table's constant (GENERATOR, LEARNER, ...), so a pool's name is written once. (Issue 54
    found 217 pool-name literals in 28 files and set a budget of 40; none is left.)"""
    found = pool_name_literals()
    assert not found, f"{len(found)} pools named by a literal (use the constant from grpo_ray.config):\n" + "\n".join(
        found
    )


def test_the_literal_count_sees_a_pool_named_in_code(monkeypatch):
    """The counter finds a literal pool name written in a step's code (and not in the table)."""
    path = ROOT / "grpo_ray" / "engines.py"
    text = path.read_text() + '\n\ndef _f(pools):\n    return pools.actors["teacher"]\n'
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if self == path else real_read(self, *a, **k))
    assert any(f.endswith("'teacher'") and "engines.py" in f for f in pool_name_literals())


def test_the_libraries_table_names_what_it_says():
    """Each outside library is one module of grpo_ray.integrations, found by the table's module:name strings: each
    names what its table says (a rows function, an Environment class, a reward function), and a data scheme is
    the library's name (``textarena://`` rows are textarena's)."""
    import inspect

    from grpo_ray import libraries
    from grpo_ray.envs import Environment

    found = {**libraries.DATA, **libraries.ENVIRONMENTS, **libraries.REWARDS}
    assert all(s.startswith("grpo_ray.integrations.") for s in found.values())
    for scheme, name in libraries.DATA.items():
        assert list(inspect.signature(libraries.find(name)).parameters) == ["spec"], name
        assert name.split(":")[0].rpartition(".")[2] == scheme.removesuffix("://")
    assert all(issubclass(libraries.find(n), Environment) for n in libraries.ENVIRONMENTS.values())
    assert all(callable(libraries.find(n)) for n in libraries.REWARDS.values())

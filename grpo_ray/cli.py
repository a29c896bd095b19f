"""The ``grpo-ray`` command: train, sft, rm, plan, prepare-data, replay, plot, export, eval, build-model.

User mistakes (``grpo_ray.errors.UserError``) print one message and exit 2,
without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time
from pathlib import Path

from grpo_ray.errors import UserError
from grpo_ray.planner.command import plan_command


def cmd_train(args) -> int:
    from grpo_ray.config import load_recipe
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner.fit import check, model_limits

    recipe = load_recipe(args.recipe, args.overrides)
    dims = model_dims(recipe.model.path)  # the shape its name gives (a tiny model is built later, in setup_run)
    model_limits(recipe, "train", dims)
    report = check(recipe, dims)
    if not report.fits:
        raise UserError(
            f"{args.recipe}: the recipe does not fit its cluster (grpo-ray plan {args.recipe} shows "
            "the whole estimate):\n" + "\n".join(f"  - {p}" for p in report.problems)
        )
    from grpo_ray.placement import local_problems

    short = local_problems(recipe)
    if short:
        raise UserError(
            f"{args.recipe}: the local Ray cluster a run starts here (this machine) cannot hold the recipe's pools; "
            "lower their num_cpus (grpo-ray plan lists each pool's) or submit the job to a larger cluster:\n"
            + "\n".join(f"  - {p}" for p in short)
        )
    from grpo_ray.telemetry.metrics import since_start

    print(
        f"{since_start()} recipe valid, and it fits its cluster (grpo-ray plan {args.recipe} shows how); "
        "checking the data and rewards",
        flush=True,
    )
    from grpo_ray.jobs.launch import train

    # the inputs inside the job: an sft:// model is trained while they are made (after the data is checked)
    return _run(
        lambda: train(recipe, _inputs(recipe, "train", args.recipe)),
        f"done: metrics in {recipe.trainer.output_dir}/metrics.jsonl",
    )


def cmd_sft(args) -> int:
    from grpo_ray.config import load_recipe
    from grpo_ray.jobs.sft import run_sft
    from grpo_ray.planner.fit import model_limits

    recipe = load_recipe(args.recipe, args.overrides, command="sft")
    model_limits(recipe, "sft")
    inputs = _inputs(recipe, "sft", args.recipe)
    return _run(
        lambda: print(f"model at {run_sft(recipe, inputs)}"), f"done: metrics in {inputs.output_dir / 'metrics.jsonl'}"
    )


def cmd_rm(args) -> int:
    from grpo_ray.config import load_recipe
    from grpo_ray.jobs.rm import run_rm
    from grpo_ray.planner.fit import model_limits

    recipe = load_recipe(args.recipe, args.overrides, command="rm")
    model_limits(recipe, "rm")
    inputs = _inputs(recipe, "rm", args.recipe)
    return _run(
        lambda: print(f"reward model at {run_rm(recipe, inputs)}"),
        f"done: metrics in {inputs.output_dir / 'metrics.jsonl'}",
    )


def _inputs(recipe, command: str, recipe_path: str):
    """Everything checked and loaded before any actor starts (grpo_ray.setup_run), said in a few lines."""
    from grpo_ray.jobs.sft import warm_start
    from grpo_ray.setup_run import setup_run
    from grpo_ray.telemetry.metrics import since_start

    inputs = setup_run(recipe, command, Path(recipe_path).parent, warm_start=warm_start)  # sft:// is trained here
    print(
        f"{since_start()} recipe, data and rewards checked: {len(inputs.train_rows)} training rows, "
        f"{len(inputs.val_rows)} validation rows; config in {inputs.output_dir / 'config.yaml'}\n"
        f"  model: {inputs.model_path}"
    )
    limits = f"data.max_prompt_length={recipe.data.max_prompt_length}"
    if command == "sft":
        limits += f" or a target over sft.max_target_length={recipe.sft.max_target_length}"
    if command == "rm":
        limits += f" or a conversation over rm.max_length={recipe.rm.max_length}"
    if command == "train":
        from grpo_ray.config import notices

        for line in notices(recipe):
            print(line)
    for spec, n in inputs.dropped.items():
        if n:
            print(f"dropped {n} rows of {spec}: prompt longer than {limits}")
    return inputs


def _run(job, done: str) -> int:
    """Run a controller's job; a stop the user can act on is one line and an exit code."""
    from grpo_ray.controller import Preempted, RunError

    try:
        job()
    except KeyboardInterrupt:
        print("interrupted: actors stopped", file=sys.stderr)
        return 130
    except Preempted as e:  # 128 + SIGTERM: a RayJob counts the attempt as failed and submits it again
        print(f"grpo-ray: preempted: {e}", file=sys.stderr)
        return 143
    except RunError as e:
        print(f"grpo-ray: run stopped: {e}", file=sys.stderr)
        return 1
    print(done)
    return 0


def cmd_prepare_data(args) -> int:
    from grpo_ray import models
    from grpo_ray.config import ModelConfig, load_recipe
    from grpo_ray.data.prepare import prepare

    tokenizer, model, limit = None, ModelConfig(path=args.tokenizer or ""), args.max_prompt_tokens
    if args.recipe:  # the recipe's model measures prompts against the recipe's own limit
        recipe = load_recipe(args.recipe)
        model = recipe.model if not args.tokenizer else model
        limit = limit or recipe.data.max_prompt_length
    if model.path:
        tokenizer = models.load_tokenizer(models.base_of(model.path), model)
    reports = prepare(
        args.name,
        args.source,
        args.out,
        tokenizer=tokenizer,
        max_prompt_tokens=limit,
        max_bad_fraction=args.max_bad_fraction,
        chat_template_kwargs=model.chat_template_kwargs,
        overwrite=args.overwrite,
        instruction=args.instruction,
        prompt_key=args.prompt_key,
        answer_key=args.answer_key,
        file_split=args.split,
        image_key=args.image_key,
    )
    for r in reports:
        print(r.line())
        for example in r.examples:
            print(f"  e.g. {example}")
    print(f"wrote {', '.join(f'{args.out}/{r.split}.parquet' for r in reports)}")
    return 0


def cmd_replay(args) -> int:
    import json

    from grpo_ray.config import load_recipe
    from grpo_ray.jobs.launch import replay

    metrics = replay(load_recipe(args.recipe, args.overrides), args.dump)
    print(json.dumps(metrics, indent=1))
    return 0


def cmd_plot(args) -> int:
    from grpo_ray.telemetry.plot import plot_runs

    out = args.out or f"{args.runs[0].rstrip('/')}/plot.png"
    print(f"wrote {plot_runs(args.runs, out)}")
    return 0


def cmd_eval(args) -> int:
    import json
    import tempfile
    from pathlib import Path

    from grpo_ray.checkpoint import export_hf
    from grpo_ray.config import load_recipe
    from grpo_ray.jobs.evaluate import DEFAULT_RECIPE, device_overrides, evaluate
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner.fit import model_limits

    out = Path(args.out)
    if (out / "eval.json").exists() and not args.overwrite:
        raise UserError(
            f"--out {out} already holds an evaluation (eval.json); nothing was changed (--overwrite replaces it)"
        )
    model, exported = args.model, None
    if (Path(model) / "manifest.json").is_file() or (Path(model) / "trainer_state.json").is_file():  # a checkpoint
        exported = tempfile.TemporaryDirectory(prefix="grpo-eval-hf-")
    try:
        if exported:
            model = str(export_hf(Path(model), Path(exported.name)))
        model_dims(model)  # the model first: a bad path is one line, before any data or Ray
        flags = [f"model.path={model}", f"generator.val_n={args.n}", f"generator.val_temperature={args.temperature}"]
        if args.max_tokens:
            flags.append(f"generator.sampling.max_tokens={args.max_tokens}")
        base = [] if args.recipe else device_overrides()  # without a recipe: this machine's device
        overrides = [*base, *args.overrides, *flags, f"trainer.output_dir={out}"]
        recipe = load_recipe(args.recipe or DEFAULT_RECIPE, overrides)
        model_limits(recipe)
        result = evaluate(recipe, args.data, out, args.limit)
    finally:  # the export a checkpoint was read through: removed when the command ends, however it ends
        if exported:
            exported.cleanup()
    print(json.dumps(result["metrics"], indent=1))
    print(
        f"{result['rows']} rows ({result['dropped_too_long']} too long); wrote {out / 'eval.json'} and "
        f"{out / 'rollouts' / 'val_data_step0.jsonl'}"
    )
    return 0


def cmd_export(args) -> int:
    from pathlib import Path

    from grpo_ray.checkpoint import export_hf
    from grpo_ray.rundir import writable_dir

    writable_dir(Path(args.out).parent, "--out")
    print(f"wrote {export_hf(args.checkpoint, args.out, args.max_shard_size, args.overwrite)}")
    return 0


def cmd_build_model(args) -> int:
    from grpo_ray import models

    print(models.resolve(args.name))
    return 0


def cmd_config(args) -> int:
    import json

    from grpo_ray import recipe_docs
    from grpo_ray.config import load_recipe

    if args.json_schema:
        print(json.dumps(recipe_docs.json_schema(), indent=1))
        return 0
    print(recipe_docs.text(load_recipe(args.recipe, args.overrides) if args.recipe else None))
    return 0


def parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    from grpo_ray.config import GPU_MEMORY_GB

    try:
        here = version("grpo-ray")
    except PackageNotFoundError:
        here = "unknown (not installed)"
    p = Parser(
        prog="grpo-ray",
        description="GRPO post-training on Ray. Overrides may come before "
        "or after options: a.b=c sets a key (a mapping value such as cluster.node_resources={} "
        "replaces the recipe's), ~a.b puts a key back to its default.",
    )
    p.add_argument("--version", action="version", version=f"grpo-ray {here}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    cf = sub.add_parser("config", help="every recipe key with its type, default, doc and (with RECIPE) its value")
    cf.add_argument("recipe", nargs="?", help="recipe YAML file (its values are shown where they are not defaults)")
    cf.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.total_steps=10")
    cf.add_argument("--json-schema", action="store_true", help="print the recipe's JSON Schema (for editors) instead")
    cf.set_defaults(func=cmd_config)

    t = sub.add_parser("train", help="train with a recipe")
    t.add_argument("recipe", help="recipe YAML file")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.total_steps=10")
    t.set_defaults(func=cmd_train)

    for name, func, what, section in (
        ("sft", cmd_sft, "supervised fine-tuning on the learner pool (prompt -> target text)", "each row's target is"),
        (
            "rm",
            cmd_rm,
            "train a reward model (a sequence classifier) on the learner pool from preference pairs or labelled "
            "responses",
            "each row's responses are",
        ),
    ):  # jobs on the learner pool alone, exported as a model
        job = sub.add_parser(name, help=f"{what}; the model is exported to OUTPUT_DIR/model")
        job.add_argument("recipe", help=f"recipe YAML file (its {name} section says where {section})")
        job.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.total_epochs=2")
        job.set_defaults(func=func)

    pn = sub.add_parser(
        "plan",
        help="placement and memory per device of a recipe, without starting anything; "
        "exit 0 when it fits, 1 when it does not",
    )
    pn.add_argument("recipe", help="recipe YAML file")
    pn.add_argument("--gpu", choices=[*GPU_MEMORY_GB, "cpu"], help="plan for these devices instead")
    pn.add_argument("--nodes", type=int, help="plan for this many nodes instead of cluster.nodes")
    pn.add_argument("--job", choices=["train", "sft", "rm"], default="train", help="the command to plan for")
    pn.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this machine's rates (matmuls, memory, calls, collectives, vLLM) for the time prediction first",
    )
    pn.add_argument(
        "--suggest",
        type=int,
        nargs="?",
        const=-1,
        default=0,
        metavar="DEVICES",
        help="the three fastest layouts that fit on DEVICES devices (default: the recipe's), as overrides",
    )
    pn.add_argument("--prompt-tokens", type=int, help="a prompt's tokens (default: data.max_prompt_length)")
    pn.add_argument("--response-tokens", type=int, help="a response's tokens (default: the response budget)")
    pn.add_argument("overrides", nargs="*", help="dotted overrides, e.g. generator.tensor_parallel_size=4")
    pn.set_defaults(func=plan_command)

    d = sub.add_parser(
        "prepare-data", help="GSM8K, MATH-500 or data of yours (custom) to train/test parquet in the verl schema"
    )
    d.add_argument("name", choices=["gsm8k", "math500", "custom"])
    d.add_argument(
        "--source",
        help="hub name or local path: a directory of train/test .jsonl or .parquet, or one "
        "file (default: the public hub name; custom needs one)",
    )
    d.add_argument("--instruction", help="text appended to each prompt, replacing the data set's own (custom: none)")
    d.add_argument(
        "--prompt-key",
        default="question",
        help="custom: the field holding the prompt (text or chat messages; dotted for nested fields)",
    )
    d.add_argument("--answer-key", default="answer", help="custom: the field holding the ground truth")
    d.add_argument(
        "--image-key",
        default="images",
        help="custom: the field holding a row's images (paths relative to the source, bytes or image features): "
        "written as verl's images column",
    )
    d.add_argument("--split", default="test", help="the split a single --source file is")
    d.add_argument("--out", required=True, help="output directory")
    d.add_argument("--recipe", help="measure prompts with this recipe's model and data.max_prompt_length")
    d.add_argument("--tokenizer", help="model whose chat template measures prompt length")
    d.add_argument("--max-prompt-tokens", type=int, default=0, help="drop longer prompts (needs a tokenizer)")
    d.add_argument("--max-bad-fraction", type=float, default=0.05, help="fail when more rows than this are bad")
    d.add_argument("--overwrite", action="store_true", help="replace split files already in --out")
    d.set_defaults(func=cmd_prepare_data)

    rp = sub.add_parser("replay", help="one learner step on a rollout dump, without generators")
    rp.add_argument("recipe", help="the recipe of the run that wrote the dump")
    rp.add_argument("dump", help="rollouts/train_data_stepN.jsonl")
    rp.add_argument("overrides", nargs="*", help="dotted overrides")
    rp.set_defaults(func=cmd_replay)

    pl = sub.add_parser("plot", help="score, length, KL, entropy, grad norm, step time, throughput against step")
    pl.add_argument("runs", nargs="+", help="run directories (several are overlaid)")
    pl.add_argument("--out", help="PNG file (default: RUN_DIR/plot.png)")
    pl.set_defaults(func=cmd_plot)

    ev = sub.add_parser("eval", help="pass@1 / pass@k of a model or checkpoint on a test set")
    ev.add_argument("model", help="hub name, model directory, tiny:// name, or OUTPUT_DIR/checkpoints/step_N")
    ev.add_argument("--data", required=True, help="gsm8k, math500, or a JSONL/parquet file")
    ev.add_argument(
        "--recipe",
        help="generator settings and reward functions come from here (default: one engine "
        "on this machine, each row scored by the reward of its data_source)",
    )
    ev.add_argument("--n", type=int, default=1, help="samples per prompt (pass@n reported when > 1)")
    ev.add_argument("--temperature", type=float, default=0.0)
    ev.add_argument("--max-tokens", type=int, default=0, help="default: the recipe's sampling.max_tokens")
    ev.add_argument("--limit", type=int, default=0, help="use the first N usable rows")
    ev.add_argument("--out", default="runs/eval", help="where eval.json and the per-sample JSONL go")
    ev.add_argument("--overwrite", action="store_true", help="replace an evaluation already in --out")
    ev.add_argument("overrides", nargs="*", help="dotted recipe overrides")
    ev.set_defaults(func=cmd_eval)

    ex = sub.add_parser("export", help="a Hugging Face model directory from a checkpoint")
    ex.add_argument("checkpoint", help="OUTPUT_DIR/checkpoints/step_N")
    ex.add_argument("--out", required=True, help="directory to write")
    ex.add_argument("--max-shard-size", default="5GB", help="safetensors shard size (an index file past one shard)")
    ex.add_argument("--overwrite", action="store_true", help="replace a --out that already holds files")
    ex.set_defaults(func=cmd_export)

    b = sub.add_parser("build-model", help="build a tiny:// model offline and print its path")
    b.add_argument("name", help="e.g. tiny://qwen2?layers=2&hidden=128")
    b.set_defaults(func=cmd_build_model)
    return p


class Parser(argparse.ArgumentParser):
    """A parser whose defaults show in --help and whose errors are one line (no usage block), a wrong choice
    answered with the choices it is closest to."""

    def __init__(self, **kwargs):
        super().__init__(formatter_class=argparse.ArgumentDefaultsHelpFormatter, **kwargs)

    def error(self, message: str):
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:
            given, choices = wrong[1], re.findall(r"'([^']*)'", wrong[2])
            close = [c for c in choices if c.startswith(given)] or difflib.get_close_matches(given, choices, n=2)
            if close:
                message += f"; did you mean {' or '.join(close)}?"
        self.exit(2, f"grpo-ray: error: {self.prog}: {message} (see {self.prog} --help)\n")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with dotted overrides (key=value) taken wherever they stand, before or after options."""
    p = parser()
    args, rest = p.parse_known_args(argv)
    stray = [
        a
        for a in rest
        if a.startswith("-") or ("=" not in a and not a.startswith("~")) or not hasattr(args, "overrides")
    ]
    if stray:
        p.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = [*getattr(args, "overrides", []), *rest] if rest else getattr(args, "overrides", None)
    return args


def main(argv: list[str] | None = None) -> int:
    from grpo_ray.telemetry import metrics

    metrics.START = time.time()  # start-up lines count from here
    args = parse(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"grpo-ray: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
